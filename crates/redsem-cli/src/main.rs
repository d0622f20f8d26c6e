//! The `redsem` command-line tool (being built: issue 4).

fn main() {}
