//! Every permit script called directly, with raw KEYS and ARGV, on a throwaway server: a file
//! per behaviour, and in `support` what they share (the keys by name, the calls as the tests
//! make them, and the set-ups several files make).

mod support;

mod batches;
mod counts_and_ranges;
mod foreign_values;
mod grants_and_queue;
mod idle_keys;
mod lost_state_and_layouts;
mod sessions_and_resends;
mod waiter_leases;
