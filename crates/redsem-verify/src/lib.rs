//! redsem's verification tools, each a binary of this crate:
//!
//! * `redsem-soak`: a fault soak of the library with a history checker (docs/SOAK.md).
//! * `redsem-mutants`: mutation testing of the Lua scripts (docs/MUTANTS.md).
//! * [`diff`]: the differential runner. The same seeded calls of every operation of the
//!   three primitives go to two engines of the protocol (the Lua library as shipped, the
//!   same with its fast paths off; a native module next), and every reply, every message
//!   published and the full contents of the keys must agree after every call. Run it with
//!   `cargo run -p redsem-verify --bin redsem-diff -- --seeds 1..=20 --steps 5000`.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod diff;
pub mod rng;
