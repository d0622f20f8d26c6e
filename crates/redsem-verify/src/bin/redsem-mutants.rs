//! `redsem-mutants`: mutation testing of the Lua scripts. See docs/MUTANTS.md.

// Its items are `pub` for one another, not for other crates.
#[allow(unreachable_pub)]
#[path = "../mutants/mod.rs"]
mod mutants;

fn main() -> std::process::ExitCode {
    mutants::main()
}
