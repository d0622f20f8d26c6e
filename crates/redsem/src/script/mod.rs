//! The script layer: typed wrappers over the Lua operations in `lua/`, one file per
//! primitive, and the only place that knows an operation's KEYS, ARGV and reply layout.
//!
//! - `library`: every operation registered once (`ops!`), the Redis Functions library built
//!   from them, and [`Call`], which runs one by `FCALL` (or `EVALSHA` where functions are
//!   refused) on a [`Scripting`] connection.
//! - `acks`: the `WAIT` a change is sent with where the client asks for replica
//!   acknowledgements, and how its answer is judged.
//! - `reply`: the cursor every wrapper reads its operation's reply with.
//! - `lease`, `permit`, `latch`: one primitive's wrappers and reply types each. Their tests
//!   (`<primitive>/tests/`, a file per behaviour, with that primitive's `support` and the
//!   shared `test_support`) call every operation directly, with raw KEYS and ARGV, on a
//!   throwaway server.
//!
//! Wrappers of operations that change state run them by [`Call::invoke_acked`] and act on a
//! shortfall of replica acknowledgements (`RedsemOptions::replica_acks`): the call fails with
//! [`Error::NotReplicated`](crate::Error::NotReplicated); a change other than a grant was
//! applied, and a grant is given back by the waiting engine that holds the request
//! ([`crate::wait`]), with its own id.

mod acks;
mod latch;
mod lease;
mod library;
mod permit;
mod reply;
#[cfg(test)]
mod test_support;

pub(crate) use acks::*;
pub(crate) use latch::*;
pub(crate) use lease::*;
#[cfg(feature = "lua-dir")]
pub use library::library_source_with;
pub use library::{protocol_library, protocol_operations};
pub(crate) use permit::*;
