//! What the module's test files share: the module file cargo built for them, a semaphore's
//! keys of each primitive, and the module's call counters.

// (Each test file uses some of these.)
#![allow(dead_code)]

use std::path::PathBuf;

use redis::Connection;

/// The module cargo built for these tests: `libredsem_module.so` beside the test binary, in
/// `target/<profile>/deps` (the package's cdylib is built with its tests; the copy in
/// `target/<profile>` is only refreshed by `cargo build`).
pub(crate) fn module() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe.with_file_name("libredsem_module.so");
    assert!(
        path.exists(),
        "{} is missing: cargo builds it with the tests",
        path.display()
    );
    path
}

/// The keys of one lease semaphore, of one permit semaphore and of one latch.
pub(crate) const LEASE: [&str; 6] = [
    "{l}:leases",
    "{l}:queue",
    "{l}:state",
    "{l}:slots",
    "{l}:tenants",
    "{l}:tqueue",
];
pub(crate) const PERMITS: [&str; 6] = [
    "{p}:count",
    "{p}:queue",
    "{p}:waiters",
    "{p}:records",
    "{p}:meta",
    "{p}:applied",
];
pub(crate) const LATCH: [&str; 4] = ["{c}:count", "{c}:done", "{c}:applied", "{c}:sessions"];

/// `REDSEM.ENGINE`'s counters: `(calls served natively, calls run by the Lua)`.
pub(crate) fn served(conn: &mut Connection) -> (u64, u64) {
    let (kind, _, _, native, lua): (String, String, String, u64, u64) = redis::cmd("REDSEM.ENGINE")
        .query(conn)
        .expect("REDSEM.ENGINE");
    assert_eq!(kind, "native");
    (native, lua)
}
