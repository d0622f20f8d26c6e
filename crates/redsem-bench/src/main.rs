//! The redsem benchmark runner (being built: issue 6).

fn main() {}
