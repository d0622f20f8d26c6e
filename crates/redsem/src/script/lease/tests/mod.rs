//! Every lease script called directly, with raw KEYS and ARGV, on a throwaway server: a file
//! per behaviour, and in `support` what they share (the keys by name, requests, calls and the
//! set-ups several files make).

mod support;

mod batches;
mod capacity_changes;
mod engine;
mod fast_paths;
mod foreign_values;
mod grants_and_slots;
mod idle_keys;
mod labels;
mod layouts;
mod lease_ends;
mod lost_state_and_repairs;
mod queue_and_wake_ups;
mod session_pruning;
mod sessions_and_resends;
mod status;
mod tenants;
mod work_budgets;
