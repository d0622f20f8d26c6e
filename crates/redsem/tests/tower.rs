//! The tower layer (`redsem::tower`) behind real HTTP servers; filled in by the next commit.
