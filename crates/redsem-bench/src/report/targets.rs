//! The targets of issues 6, 10, 19 and 27 (35's in `noisy.rs`), judged against a run's figures.

use super::{Figures, Target, find, num, pct, us, us1};
use crate::core::CycleRun;

/// Issue 27: the most Redis's `used_memory` may grow over S11, per semaphore, MB.
const S11_GROWTH_MB: f64 = 8.0;

/// Issue 27: "the last 10 s no slower than the first", judged on Redis CPU per cycle with the
/// margin of its window-to-window noise: two 60 s runs of the polling baseline in S11's loop
/// (a workload whose keys do not grow) at a load average of 7.6–9.5 on the shared 2-core VM
/// gave 24.8–32.2 µs per cycle across their twelve 10 s windows, 1.25× apart at most
/// (docs/history/2026-11-28-benchmarks.md, "Before: layout 1").
const S11_LAST_OVER_FIRST: f64 = 1.25;

impl Figures {
    pub(crate) fn targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        // The S1 yardstick: two raw EVALSHA round trips, p50 — timed alongside S1 when it ran,
        // else from S8.
        let yardstick: Option<(f64, &str)> = self
            .s1
            .as_ref()
            .and_then(|s1| s1.two_raw_evalsha.as_ref())
            .map(|l| (l.p50_us, "timed alongside S1"))
            .or_else(|| {
                self.s8
                    .as_ref()
                    .and_then(|r| r.point(1, 1))
                    .map(|p| (2.0 * p.evalsha.p50_us, "from S8"))
            });
        match (&self.s1, yardstick) {
            (Some(s1), Some((pair, whence))) => {
                let limit = 1.25 * pair;
                out.push(Target {
                    issue: 6,
                    scenario: "S1",
                    target: format!(
                        "cycle p50 ≤ 1.25 × two raw EVALSHA round trips ({} p50, {whence}) = {}",
                        us(pair),
                        us(limit)
                    ),
                    figure: format!(
                        "{} ({:.1}×)",
                        us(s1.cycle.p50_us),
                        s1.cycle.p50_us / pair.max(1e-9)
                    ),
                    met: Some(s1.cycle.p50_us <= limit),
                });
            }
            _ => out.push(unmeasured(
                6,
                "S1",
                "cycle p50 ≤ 1.25 × 2 raw EVALSHA round trips",
            )),
        }
        let mut s2_any = false;
        for run in self.s2.iter().filter(|r| r.tasks == 64) {
            let Some(raw) = self
                .s8
                .as_ref()
                .and_then(|r| r.point(run.tasks, run.clients))
            else {
                continue;
            };
            s2_any = true;
            let cmds = run.server.evalsha_per_cycle.max(1.0);
            let limit = 0.5 * raw.evalsha_per_s / cmds;
            out.push(Target {
                issue: 6,
                scenario: "S2",
                target: format!(
                    "64 tasks, {} client(s): ≥ 50 % × raw EVALSHA {}/s ÷ {:.2} commands per cycle = {}/s",
                    run.clients,
                    num(raw.evalsha_per_s),
                    cmds,
                    num(limit)
                ),
                figure: format!(
                    "{}/s ({} of raw ÷ commands)",
                    num(run.cycles_per_s),
                    pct(run.cycles_per_s / (raw.evalsha_per_s / cmds))
                ),
                met: Some(run.cycles_per_s >= limit),
            });
        }
        if !s2_any {
            out.push(unmeasured(
                6,
                "S2",
                "64 tasks ≥ 50 % of raw EVALSHA rate ÷ commands per cycle",
            ));
        }
        match &self.s3 {
            Some(s3) => {
                out.push(Target {
                    issue: 6,
                    scenario: "S3",
                    target: "hand-off p50 ≤ 1 ms".to_owned(),
                    figure: us(s3.handoff.p50_us),
                    met: Some(s3.handoff.p50_us <= 1000.0),
                });
                out.push(Target {
                    issue: 6,
                    scenario: "S3",
                    target: "hand-off p99 ≤ 5 ms".to_owned(),
                    figure: us(s3.handoff.p99_us),
                    met: Some(s3.handoff.p99_us <= 5000.0),
                });
            }
            None => out.push(unmeasured(6, "S3", "hand-off p50 ≤ 1 ms and p99 ≤ 5 ms")),
        }
        if let Some(pl) = &self.permit_and_latch {
            for (what, run) in [("permits", &pl.permits_s1), ("latch", &pl.latch_s1)] {
                let pair = run
                    .as_ref()
                    .and_then(|r| r.two_raw_evalsha.as_ref())
                    .map(|l| l.p50_us);
                if let (Some(r), Some(pair)) = (run, pair) {
                    let limit = 1.25 * pair;
                    out.push(Target {
                        issue: 6,
                        scenario: "S1",
                        target: format!(
                            "{what}: cycle p50 ≤ 1.25 × two raw EVALSHA round trips ({} p50, timed alongside) = {}",
                            us(pair),
                            us(limit)
                        ),
                        figure: format!("{} ({:.1}×)", us(r.cycle.p50_us), r.cycle.p50_us / pair.max(1e-9)),
                        met: Some(r.cycle.p50_us <= limit),
                    });
                }
            }
            for (what, run) in [("permits", &pl.permits_s3), ("latch", &pl.latch_s3)] {
                if let Some(h) = run {
                    out.push(Target {
                        issue: 6,
                        scenario: "S3",
                        target: format!("{what}: hand-off p50 ≤ 1 ms and p99 ≤ 5 ms"),
                        figure: format!("{} / {}", us(h.handoff.p50_us), us(h.handoff.p99_us)),
                        met: Some(h.handoff.p50_us <= 1000.0 && h.handoff.p99_us <= 5000.0),
                    });
                }
            }
        }
        match &self.s4 {
            Some(s4) => out.push(Target {
                issue: 6,
                scenario: "S4",
                target: format!("zero inversions over {} waiters", s4.waiters),
                figure: s4.inversions.to_string(),
                met: Some(s4.inversions == 0),
            }),
            None => out.push(unmeasured(6, "S4", "zero inversions")),
        }
        match &self.s5 {
            Some(s5) => {
                if let (Some(lo), Some(hi)) = (s5.levels.first(), s5.levels.last()) {
                    out.push(Target {
                        issue: 6,
                        scenario: "S5",
                        target: format!(
                            "cycle p50 at {} holders ≤ 2 × at {} holders (2 × {}) = {}",
                            num(hi.holders as f64),
                            num(lo.holders as f64),
                            us(lo.run.cycle.p50_us),
                            us(2.0 * lo.run.cycle.p50_us)
                        ),
                        figure: format!(
                            "{} ({:.2}×)",
                            us(hi.run.cycle.p50_us),
                            hi.run.cycle.p50_us / lo.run.cycle.p50_us.max(1e-9)
                        ),
                        met: Some(hi.run.cycle.p50_us <= 2.0 * lo.run.cycle.p50_us),
                    });
                }
                let conns = s5.connections.normal + s5.connections.pubsub;
                out.push(Target {
                    issue: 6,
                    scenario: "S5",
                    target: format!("{} waiters on ≤ 2 connections", num(s5.waiters as f64)),
                    figure: format!(
                        "{conns} ({} normal + {} pub/sub)",
                        s5.connections.normal, s5.connections.pubsub
                    ),
                    met: Some(conns <= 2),
                });
            }
            None => out.push(unmeasured(6, "S5", "holders and waiters scale")),
        }
        match &self.s6 {
            Some(s6) => out.push(Target {
                issue: 6,
                scenario: "S6",
                target: "2 commands per uncontended cycle".to_owned(),
                figure: format!("{:.2}", s6.redsem.client_commands_per_cycle),
                met: Some(s6.redsem.client_commands_per_cycle <= 2.0 + 1e-9),
            }),
            None => out.push(unmeasured(6, "S6", "2 commands per uncontended cycle")),
        }
        out.extend(self.issue10_targets());
        out.extend(self.issue19_targets());
        out.extend(self.issue27_targets());
        out.extend(self.issue35_targets());
        out
    }

    /// Issue 27: S11's memory growth and its last window's server time per cycle against its
    /// first, for each semaphore.
    fn issue27_targets(&self) -> Vec<Target> {
        let Some(s11) = &self.s11 else {
            return vec![unmeasured(
                27,
                "S11",
                "steady state: used_memory growth ≤ 8 MB, last window no slower than the first",
            )];
        };
        let mut out = Vec::new();
        for (what, run) in [("lease", &s11.lease), ("permits", &s11.permits)] {
            let (cpu, scripts) = (&run.cpu_us_per_cycle, &run.command_us_per_cycle);
            out.push(Target {
                issue: 27,
                scenario: "S11",
                target: format!(
                    "{what}: used_memory growth over {:.0} s ≤ {S11_GROWTH_MB} MB",
                    run.elapsed_s
                ),
                figure: format!(
                    "{:+.1} MB ({} cycles/s)",
                    run.used_memory_growth_mb,
                    num(run.cycles_per_s)
                ),
                met: Some(run.used_memory_growth_mb <= S11_GROWTH_MB),
            });
            out.push(Target {
                issue: 27,
                scenario: "S11",
                target: format!(
                    "{what}: Redis CPU per cycle (INFO cpu), last window ≤ {S11_LAST_OVER_FIRST} × first"
                ),
                figure: format!(
                    "{} / {} ({:.2}×; in scripts by INFO commandstats: {} / {}, {:.2}×)",
                    us1(cpu.first_us),
                    us1(cpu.last_us),
                    cpu.last_over_first,
                    us1(scripts.first_us),
                    us1(scripts.last_us),
                    scripts.last_over_first
                ),
                met: Some(cpu.last_over_first <= S11_LAST_OVER_FIRST),
            });
        }
        out
    }

    /// Issue 19: S10, redsem against the polling baseline in the same run: at least its
    /// cycles/s, at most a fifth of its Redis CPU, a lower p99 wait.
    fn issue19_targets(&self) -> Vec<Target> {
        let Some(s10) = &self.s10 else {
            return vec![unmeasured(
                19,
                "S10",
                "many waiters: redsem ≥ 1.0× polling cycles/s, ≤ 1/5 of its Redis CPU, lower p99 wait",
            )];
        };
        let (r, p) = (&s10.redsem, &s10.polling);
        let ratio = r.cycles_per_s / p.cycles_per_s.max(1e-9);
        let cpu = r.redis_cpu_share / p.redis_cpu_share.max(1e-9);
        vec![
            Target {
                issue: 19,
                scenario: "S10",
                target: format!(
                    "many waiters: redsem ≥ 1.0× polling cycles/s ({}/s; ceiling {}/s)",
                    num(p.cycles_per_s),
                    num(p.ceiling_per_s)
                ),
                figure: format!("{}/s ({ratio:.2}×)", num(r.cycles_per_s)),
                met: Some(ratio >= 1.0),
            },
            Target {
                issue: 19,
                scenario: "S10",
                target: format!(
                    "many waiters: redsem Redis CPU ≤ 1/5 of polling's ({} / 5 = {})",
                    pct(p.redis_cpu_share),
                    pct(p.redis_cpu_share / 5.0)
                ),
                figure: format!("{} ({cpu:.2}× polling's)", pct(r.redis_cpu_share)),
                met: Some(5.0 * r.redis_cpu_share <= p.redis_cpu_share),
            },
            Target {
                issue: 19,
                scenario: "S10",
                target: format!(
                    "many waiters: redsem wait p99 < polling's ({})",
                    us(p.wait.p99_us)
                ),
                figure: us(r.wait.p99_us),
                met: Some(r.wait.p99_us < p.wait.p99_us),
            },
        ]
    }

    /// Issue 10: redsem against the polling baseline (S9), measured in the same run.
    fn issue10_targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        let polling = self.s9.as_ref();
        let mut s2_any = false;
        for run in self.s2.iter().filter(|r| r.tasks == 64) {
            let Some(p) = polling.and_then(|p| find(&p.s2, run.tasks, run.clients)) else {
                continue;
            };
            s2_any = true;
            let ratio = run.cycles_per_s / p.cycles_per_s.max(1e-9);
            out.push(Target {
                issue: 10,
                scenario: "S2",
                target: format!(
                    "64 tasks, capacity 8, no hold, {} client(s): redsem ≥ 1.0× polling cycles/s ({}/s)",
                    run.clients,
                    num(p.cycles_per_s)
                ),
                figure: format!("{}/s ({ratio:.2}×)", num(run.cycles_per_s)),
                met: Some(ratio >= 1.0),
            });
        }
        if !s2_any {
            out.push(unmeasured(
                10,
                "S2",
                "64 tasks, capacity 8, no hold: redsem ≥ 1.0× polling cycles/s (needs S2 and S9)",
            ));
        }
        // Preferably the redsem S1 timed in slices alternating with the baseline's; else S1's.
        let (redsem_s1, whence) = match polling.and_then(|p| p.s1_redsem_alongside.as_ref()) {
            Some(r) => (Some(r), "alternating slices in S9"),
            None => (self.s1.as_ref(), "S1 and S9 timed apart"),
        };
        match (redsem_s1, polling.and_then(|p| p.s1.as_ref())) {
            (Some(r), Some(p)) => {
                let ratio = r.cycles_per_s / p.cycles_per_s.max(1e-9);
                let pair = |c: &CycleRun| {
                    c.two_raw_evalsha
                        .as_ref()
                        .map_or_else(|| "—".to_owned(), |l| us(l.p50_us))
                };
                out.push(Target {
                    issue: 10,
                    scenario: "S1",
                    target: format!(
                        "1 client uncontended: redsem ≥ 0.9× polling cycles/s (0.9 × {} = {}/s)",
                        num(p.cycles_per_s),
                        num(0.9 * p.cycles_per_s)
                    ),
                    figure: format!(
                        "{}/s ({ratio:.2}×; {whence}; 2 raw EVALSHA alongside: {} and {} p50)",
                        num(r.cycles_per_s),
                        pair(r),
                        pair(p),
                    ),
                    met: Some(ratio >= 0.9),
                });
            }
            _ => out.push(unmeasured(
                10,
                "S1",
                "1 client uncontended: redsem ≥ 0.9× polling cycles/s (needs S9)",
            )),
        }
        match redsem_s1 {
            Some(r) => out.push(Target {
                issue: 10,
                scenario: "S1",
                target: "Redis CPU per uncontended cycle ≤ 20 µs (INFO cpu)".to_owned(),
                figure: format!(
                    "{} ({whence}; {} in commands by INFO commandstats; polling: {})",
                    us1(r.server.redis_cpu_us_per_cycle),
                    us1(r.server.command_usec_per_cycle),
                    polling
                        .and_then(|p| p.s1.as_ref())
                        .map_or_else(|| "—".to_owned(), |p| us1(p.server.redis_cpu_us_per_cycle))
                ),
                met: Some(r.server.redis_cpu_us_per_cycle <= 20.0),
            }),
            None => out.push(unmeasured(
                10,
                "S1",
                "Redis CPU per uncontended cycle ≤ 20 µs",
            )),
        }
        match &self.s3 {
            Some(r) => out.push(Target {
                issue: 10,
                scenario: "S3",
                target: "hand-off p50 ≤ 1 ms".to_owned(),
                figure: format!(
                    "{} (polling: {})",
                    us(r.handoff.p50_us),
                    polling
                        .and_then(|p| p.s3.as_ref())
                        .map_or_else(|| "—".to_owned(), |p| us(p.handoff.p50_us))
                ),
                met: Some(r.handoff.p50_us <= 1000.0),
            }),
            None => out.push(unmeasured(10, "S3", "hand-off p50 ≤ 1 ms")),
        }
        out
    }
}

pub(super) fn unmeasured(issue: u32, scenario: &'static str, target: &str) -> Target {
    Target {
        issue,
        scenario,
        target: target.to_owned(),
        figure: "—".to_owned(),
        met: None,
    }
}
