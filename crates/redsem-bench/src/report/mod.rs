//! Every figure of a run, the targets of issues 6, 10, 19, 27 and 35 judged against them, the
//! invariants that make the run fail, and the table printed to stdout.

mod noisy;
mod sections;
mod table;
mod targets;
#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::core::{ContendedRun, CycleRun, FairnessRun, HandoffRun};
use crate::cost::CostRun;
use crate::counters::CountersRun;
use crate::many::{ManyRun, ManyWaitersRun};
use crate::noisy::NoisyNeighbourRun;
use crate::raw::RawRun;
use crate::scale::ScaleRun;
use crate::steady::SteadyStateRun;
use table::Table;

/// A baseline algorithm through S1–S4: the seeds' (S7) or the polling one (S9).
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct BaselineRun {
    pub(crate) s1: Option<CycleRun>,
    /// Round trips per S1 cycle, counted by the baseline's own client.
    pub(crate) s1_round_trips_per_cycle: f64,
    /// redsem's S1 timed in slices alternating with this baseline's `s1` (S9 only).
    pub(crate) s1_redsem_alongside: Option<CycleRun>,
    pub(crate) s2: Vec<ContendedRun>,
    /// S2 with each holder holding (`Sizes::s2_hold`).
    pub(crate) s2_hold: Vec<ContendedRun>,
    pub(crate) s3: Option<HandoffRun>,
    pub(crate) s4: Option<FairnessRun>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Figures {
    pub(crate) s1: Option<CycleRun>,
    pub(crate) s2: Vec<ContendedRun>,
    /// S2 with each holder holding (`Sizes::s2_hold`).
    pub(crate) s2_hold: Vec<ContendedRun>,
    pub(crate) s3: Option<HandoffRun>,
    pub(crate) s4: Option<FairnessRun>,
    pub(crate) s5: Option<ScaleRun>,
    pub(crate) s6: Option<CostRun>,
    pub(crate) s7: Option<BaselineRun>,
    pub(crate) s8: Option<RawRun>,
    /// The polling baseline (npm `redis-semaphore`'s algorithm).
    pub(crate) s9: Option<BaselineRun>,
    /// Many waiters: redsem and the polling baseline.
    pub(crate) s10: Option<ManyWaitersRun>,
    /// The S1 and S3 equivalents for the permit semaphore and the latch.
    pub(crate) permit_and_latch: Option<CountersRun>,
    /// Steady state: a minute of uncontended cycles, lease and permits.
    pub(crate) s11: Option<SteadyStateRun>,
    /// Noisy neighbour: the plain FIFO and fair shares between two tenants.
    pub(crate) s12: Option<NoisyNeighbourRun>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Target {
    /// The issue that set it (6: the first targets; 10: against the polling baseline;
    /// 19: many waiters; 27: steady state).
    pub(crate) issue: u32,
    pub(crate) scenario: &'static str,
    pub(crate) target: String,
    pub(crate) figure: String,
    /// `None`: not measured in this run.
    pub(crate) met: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Invariant {
    pub(crate) scenario: &'static str,
    pub(crate) what: String,
    pub(crate) held: bool,
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn num(v: f64) -> String {
    let digits = format!("{:.0}", v.abs().round());
    let mut out = String::from(if v <= -0.5 { "-" } else { "" });
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn pct(v: f64) -> String {
    format!("{:.0} %", v * 100.0)
}

/// µs with one decimal below 100 µs (per-cycle server costs).
fn us1(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.1} µs")
    } else {
        us(v)
    }
}

/// ", hold 1 ms" for a run whose holders held, else nothing.
fn hold(run: &ContendedRun) -> String {
    if run.hold_ms > 0.0 {
        format!(", hold {} ms", run.hold_ms)
    } else {
        String::new()
    }
}

/// The run of `runs` at (`tasks`, `clients`).
fn find(runs: &[ContendedRun], tasks: usize, clients: usize) -> Option<&ContendedRun> {
    runs.iter()
        .find(|r| r.tasks == tasks && r.clients == clients)
}

impl Figures {
    /// What must hold for redsem in every run, smoke included.
    /// The polling baseline (S9) is held to the limit too, but not to FIFO order: it is unfair
    /// by design, so its inversions are reported, never judged.
    pub(crate) fn invariants(&self) -> Vec<Invariant> {
        let mut out = Vec::new();
        let contended = |out: &mut Vec<Invariant>, scenario, who: &str, run: &ContendedRun| {
            let point = format!(
                "{who}{} tasks / {} clients{}",
                run.tasks,
                run.clients,
                hold(run)
            );
            out.push(Invariant {
                scenario,
                what: format!(
                    "{point}: max simultaneous holders {} ≤ capacity {}",
                    run.max_holders, run.capacity
                ),
                held: run.max_holders <= run.capacity,
            });
            out.push(Invariant {
                scenario,
                what: format!("{point}: every task finished"),
                held: run.all_finished,
            });
        };
        for run in self.s2.iter().chain(&self.s2_hold) {
            contended(&mut out, "S2", "", run);
        }
        if let Some(p) = &self.s9 {
            for run in p.s2.iter().chain(&p.s2_hold) {
                contended(&mut out, "S9", "polling: ", run);
            }
        }
        if let Some(run) = self
            .permit_and_latch
            .as_ref()
            .and_then(|pl| pl.permits_s2.as_ref())
        {
            contended(&mut out, "S2", "permits: ", run);
        }
        if let Some(s10) = &self.s10 {
            let many = |out: &mut Vec<Invariant>, who: &str, run: &ManyRun| {
                let point = format!(
                    "{who}{} tasks / {} clients, hold {} ms",
                    run.tasks, run.clients, run.hold_ms
                );
                out.push(Invariant {
                    scenario: "S10",
                    what: format!(
                        "{point}: max simultaneous holders {} ≤ capacity {}",
                        run.max_holders, run.capacity
                    ),
                    held: run.max_holders <= run.capacity,
                });
                out.push(Invariant {
                    scenario: "S10",
                    what: format!("{point}: every task finished"),
                    held: run.all_finished,
                });
            };
            many(&mut out, "", &s10.redsem);
            many(&mut out, "polling: ", &s10.polling);
        }
        if let Some(s12) = &self.s12 {
            for run in [&s12.fifo, &s12.shares] {
                let point = format!("{}: {} + {} tasks", run.mode, run.a_tasks, run.b_tasks);
                out.push(Invariant {
                    scenario: "S12",
                    what: format!(
                        "{point}: max simultaneous holders {} ≤ capacity {}",
                        run.max_holders, run.capacity
                    ),
                    held: run.max_holders <= run.capacity,
                });
                out.push(Invariant {
                    scenario: "S12",
                    what: format!("{point}: every task finished"),
                    held: run.all_finished,
                });
            }
        }
        if let Some(s4) = &self.s4 {
            out.push(Invariant {
                scenario: "S4",
                what: format!("{} inversions against arrival order = 0", s4.inversions),
                held: s4.inversions == 0,
            });
        }
        if let Some(s5) = &self.s5 {
            out.push(Invariant {
                scenario: "S5",
                what: format!(
                    "{} of {} waiting tasks queued in Redis",
                    s5.queued_in_redis, s5.waiters
                ),
                held: s5.queued_in_redis == s5.waiters,
            });
        }
        out
    }

    /// The human-readable table: each scenario's section in turn, then the targets and
    /// invariants.
    pub(crate) fn table(&self, targets: &[Target], invariants: &[Invariant]) -> String {
        let mut t = Table::default();
        self.s1_section(&mut t);
        self.s2_section(&mut t, false);
        self.s2_section(&mut t, true);
        self.s3_section(&mut t);
        self.s4_section(&mut t);
        self.s10_section(&mut t);
        self.s12_section(&mut t);
        self.s5_section(&mut t);
        self.s6_section(&mut t);
        self.s8_section(&mut t);
        self.counters_section(&mut t);
        self.s11_section(&mut t);
        let mut out = t.render();
        sections::footer(&mut out, targets, invariants);
        out
    }
}
