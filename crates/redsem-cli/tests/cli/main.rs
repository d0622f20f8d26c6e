//! Black-box tests of the `redsem` binary, each against its own throwaway `redis-server`.
//!
//! Every wait has a deadline (`support::LIMIT`, or a tighter one where the contract sets one),
//! so a hang fails the test instead of stalling the run. Leases are hundreds of milliseconds.

/// Running the binary, processes and deadlines.
mod support;

/// Reaching Redis: `rediss://` (TLS) and `--tls-ca`, `user:password@`, passwords kept out of
/// messages.
mod connect;
/// `doctor`: each check's finding and the exit code of the worst.
mod doctor;
/// One test per exit code (0, 1, 2, 69, 75, 76) and every usage error.
mod exit_codes;
/// What a new user still trips on: a stray word before `--`, `status` of a name
/// without permits, a port out of range, `redsem` alone.
mod fresh_clone;
/// What users of flock, timeout and consul lock bring: their spellings, `lock`, `-c`, closed
/// pipes, servers that are not Redis, `status` of permits and latches.
mod habits;
/// `latch NAME set|count-down|await|count`.
mod latch;
/// `acquire`, `refresh`, `release`, `status`, global options, help and completions.
mod manage;
/// Figures for the closing note: printed (`--nocapture`), never asserted.
mod measure;
/// What a new user trips on: suggestions for typos, error texts, `status` of every
/// primitive, one JSON schema, latches never set, short and long help.
mod newcomer;
/// `serve` over HTTP (`/metrics`, the status page, `/status.json`) and `status --watch`.
mod observe;
/// `permits NAME add|try-set|acquire|release|available`.
mod permits;
/// `run`: the command's environment and stdio, signals, leases kept and lost, waiting.
mod run;
/// Tenants: `--tenant`, `--weight`, `--cap` on `run`, `lock` and `acquire`; per-tenant
/// `status` and `serve`; exit 65 for a tenant's conflicting settings.
mod tenants;
/// `--url` forms for a Redis Cluster and for Sentinels: `run`, `status` and `doctor` through
/// them.
mod topologies;
/// `run` and the command's whole process tree: background jobs, daemons, a lost lease.
mod tree;
/// Defects found by using the binary as a user would: a one-node cluster's empty address, a
/// killed queued `acquire`.
mod user_defects;

/// Managed services emulated by ACL users (`redsem_test::profiles`): run, lock, status, serve
/// and doctor as each service's user.
mod profiles;
