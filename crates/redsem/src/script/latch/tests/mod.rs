//! Every latch script called directly, with raw KEYS and ARGV, on a throwaway server: a file
//! per behaviour, and in `support` what they share. (The cluster test of the latch scripts is
//! `counter_scripts_run_on_a_three_master_cluster`, with the permit scripts' tests.)

mod support;

mod counting;
mod foreign_values;
mod pruning;
mod session_records;
