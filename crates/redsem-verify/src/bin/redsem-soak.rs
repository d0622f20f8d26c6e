//! `redsem-soak`: a fault soak of redsem with a history checker. See docs/SOAK.md.

// Its items are `pub` for one another, not for other crates.
#[allow(unreachable_pub)]
#[path = "../soak/mod.rs"]
mod soak;

fn main() -> std::process::ExitCode {
    soak::main()
}
