//! Every figure of a run, the targets of issue 6 judged against them, the invariants that
//! make the run fail, and the table printed to stdout.

use std::fmt::Write as _;

use serde::Serialize;

use crate::core::{ContendedRun, CycleRun, FairnessRun, HandoffRun};
use crate::cost::CostRun;
use crate::counters::CountersRun;
use crate::raw::RawRun;
use crate::scale::ScaleRun;

/// The seeds' algorithm through S1–S4.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SeedsRun {
    pub(crate) s1: Option<CycleRun>,
    /// Round trips per S1 cycle, counted by the seeds client.
    pub(crate) s1_round_trips_per_cycle: f64,
    pub(crate) s2: Vec<ContendedRun>,
    pub(crate) s3: Option<HandoffRun>,
    pub(crate) s4: Option<FairnessRun>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Figures {
    pub(crate) s1: Option<CycleRun>,
    pub(crate) s2: Vec<ContendedRun>,
    pub(crate) s3: Option<HandoffRun>,
    pub(crate) s4: Option<FairnessRun>,
    pub(crate) s5: Option<ScaleRun>,
    pub(crate) s6: Option<CostRun>,
    pub(crate) s7: Option<SeedsRun>,
    pub(crate) s8: Option<RawRun>,
    /// The S1 and S3 equivalents for the permit semaphore and the latch.
    pub(crate) permit_and_latch: Option<CountersRun>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Target {
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
                "S2",
                "64 tasks ≥ 50 % of raw EVALSHA rate ÷ commands per cycle",
            ));
        }
        match &self.s3 {
            Some(s3) => {
                out.push(Target {
                    scenario: "S3",
                    target: "hand-off p50 ≤ 1 ms".to_owned(),
                    figure: us(s3.handoff.p50_us),
                    met: Some(s3.handoff.p50_us <= 1000.0),
                });
                out.push(Target {
                    scenario: "S3",
                    target: "hand-off p99 ≤ 5 ms".to_owned(),
                    figure: us(s3.handoff.p99_us),
                    met: Some(s3.handoff.p99_us <= 5000.0),
                });
            }
            None => out.push(unmeasured("S3", "hand-off p50 ≤ 1 ms and p99 ≤ 5 ms")),
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
                scenario: "S4",
                target: format!("zero inversions over {} waiters", s4.waiters),
                figure: s4.inversions.to_string(),
                met: Some(s4.inversions == 0),
            }),
            None => out.push(unmeasured("S4", "zero inversions")),
        }
        match &self.s5 {
            Some(s5) => {
                if let (Some(lo), Some(hi)) = (s5.levels.first(), s5.levels.last()) {
                    out.push(Target {
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
                    scenario: "S5",
                    target: format!("{} waiters on ≤ 2 connections", num(s5.waiters as f64)),
                    figure: format!(
                        "{conns} ({} normal + {} pub/sub)",
                        s5.connections.normal, s5.connections.pubsub
                    ),
                    met: Some(conns <= 2),
                });
            }
            None => out.push(unmeasured("S5", "holders and waiters scale")),
        }
        match &self.s6 {
            Some(s6) => out.push(Target {
                scenario: "S6",
                target: "2 commands per uncontended cycle".to_owned(),
                figure: format!("{:.2}", s6.redsem.client_commands_per_cycle),
                met: Some(s6.redsem.client_commands_per_cycle <= 2.0 + 1e-9),
            }),
            None => out.push(unmeasured("S6", "2 commands per uncontended cycle")),
        }
        out
    }

    /// What must hold for redsem in every run, smoke included.
    pub(crate) fn invariants(&self) -> Vec<Invariant> {
        let mut out = Vec::new();
        for run in &self.s2 {
            out.push(Invariant {
                scenario: "S2",
                what: format!(
                    "{} tasks / {} clients: max simultaneous holders {} ≤ capacity {}",
                    run.tasks, run.clients, run.max_holders, run.capacity
                ),
                held: run.max_holders <= run.capacity,
            });
            out.push(Invariant {
                scenario: "S2",
                what: format!(
                    "{} tasks / {} clients: every task finished",
                    run.tasks, run.clients
                ),
                held: run.all_finished,
            });
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

    /// The human-readable table.
    pub(crate) fn table(&self, targets: &[Target], invariants: &[Invariant]) -> String {
        let mut rows: Vec<[String; 5]> = Vec::new();
        let head = |rows: &mut Vec<[String; 5]>, s: &str| {
            rows.push([
                s.to_owned(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
        };
        let row = |rows: &mut Vec<[String; 5]>, m: &str, a: String, b: String, c: String| {
            rows.push([format!("  {m}"), a, b, c, String::new()]);
        };
        let seeds = self.s7.as_ref();
        let raw = self.s8.as_ref();
        let dash = || "—".to_owned();

        if self.s1.is_some() || seeds.and_then(|s| s.s1.as_ref()).is_some() {
            head(
                &mut rows,
                "S1 uncontended: 1 client, capacity 5, try_acquire + release",
            );
            let r = self.s1.as_ref();
            let s = seeds.and_then(|s| s.s1.as_ref());
            let l = r.and_then(|r| r.two_raw_evalsha.as_ref());
            row(
                &mut rows,
                "cycles/s",
                r.map_or_else(dash, |r| {
                    let ratio = r.two_raw_evalsha.as_ref().map_or(String::new(), |l| {
                        format!(" ({} of raw pairs)", pct(r.cycles_per_s * l.mean_us / 1e6))
                    });
                    format!("{}{ratio}", num(r.cycles_per_s))
                }),
                s.map_or_else(dash, |s| num(s.cycles_per_s)),
                l.map_or_else(dash, |l| {
                    format!("{} (EVALSHA pairs/s)", num(1e6 / l.mean_us.max(1e-9)))
                }),
            );
            row(
                &mut rows,
                "cycle p50 / p99",
                r.map_or_else(dash, |r| {
                    format!("{} / {}", us(r.cycle.p50_us), us(r.cycle.p99_us))
                }),
                s.map_or_else(dash, |s| {
                    format!("{} / {}", us(s.cycle.p50_us), us(s.cycle.p99_us))
                }),
                l.map_or_else(dash, |l| {
                    format!("{} / {} (2 EVALSHA)", us(l.p50_us), us(l.p99_us))
                }),
            );
            row(
                &mut rows,
                "Redis CPU per cycle",
                r.map_or_else(dash, |r| us(r.server.redis_cpu_us_per_cycle)),
                s.map_or_else(dash, |s| us(s.server.redis_cpu_us_per_cycle)),
                dash(),
            );
        }
        let seeds_s2 = seeds.map(|s| s.s2.as_slice()).unwrap_or_default();
        let mut points: Vec<(usize, usize)> = self
            .s2
            .iter()
            .chain(seeds_s2)
            .map(|r| (r.tasks, r.clients))
            .collect();
        points.sort_unstable();
        points.dedup();
        if !points.is_empty() {
            head(
                &mut rows,
                "S2 contended: capacity 8, acquire (waiting) + release",
            );
        }
        for (tasks, clients) in points {
            let r = self
                .s2
                .iter()
                .find(|r| r.tasks == tasks && r.clients == clients);
            let s = seeds_s2
                .iter()
                .find(|r| r.tasks == tasks && r.clients == clients);
            let l = raw.and_then(|r| r.point(tasks, clients));
            row(
                &mut rows,
                &format!("{tasks} tasks, {clients} client(s): cycles/s"),
                r.map_or_else(dash, |r| {
                    let ratio = l.map_or(String::new(), |l| {
                        format!(" ({} of raw)", pct(r.cycles_per_s / l.evalsha_per_s))
                    });
                    format!("{}{ratio}", num(r.cycles_per_s))
                }),
                s.map_or_else(dash, |s| num(s.cycles_per_s)),
                l.map_or_else(dash, |l| format!("{} EVALSHA/s", num(l.evalsha_per_s))),
            );
            row(
                &mut rows,
                "    wait p50 / p99",
                r.map_or_else(dash, |r| {
                    format!("{} / {}", us(r.wait.p50_us), us(r.wait.p99_us))
                }),
                s.map_or_else(dash, |s| {
                    format!("{} / {}", us(s.wait.p50_us), us(s.wait.p99_us))
                }),
                l.map_or_else(dash, |l| {
                    format!(
                        "{} / {} per EVALSHA",
                        us(l.evalsha.p50_us),
                        us(l.evalsha.p99_us)
                    )
                }),
            );
            row(
                &mut rows,
                "    max holders seen (≤ 8)",
                r.map_or_else(dash, |r| r.max_holders.to_string()),
                s.map_or_else(dash, |s| s.max_holders.to_string()),
                dash(),
            );
            row(
                &mut rows,
                "    EVALSHA per cycle; Redis CPU busy",
                r.map_or_else(dash, |r| {
                    format!(
                        "{:.2}; {}",
                        r.server.evalsha_per_cycle,
                        pct(r.server.redis_cpu_share)
                    )
                }),
                s.map_or_else(dash, |s| format!("—; {}", pct(s.server.redis_cpu_share))),
                dash(),
            );
        }
        if self.s3.is_some() || seeds.and_then(|s| s.s3.as_ref()).is_some() {
            head(
                &mut rows,
                "S3 hand-off: capacity 1, release → waiter's grant",
            );
            let f = |h: &HandoffRun| {
                format!(
                    "{} / {} ({} trials)",
                    us(h.handoff.p50_us),
                    us(h.handoff.p99_us),
                    h.trials
                )
            };
            row(
                &mut rows,
                "p50 / p99",
                self.s3.as_ref().map_or_else(dash, f),
                seeds.and_then(|s| s.s3.as_ref()).map_or_else(dash, f),
                raw.and_then(|r| r.point(1, 1)).map_or_else(dash, |l| {
                    format!("{} (2 EVALSHA)", us(2.0 * l.evalsha.p50_us))
                }),
            );
        }
        if self.s4.is_some() || seeds.and_then(|s| s.s4.as_ref()).is_some() {
            head(&mut rows, "S4 fairness: waiters enqueued in a known order");
            let f = |r: &FairnessRun| format!("{} of {} waiters", r.inversions, r.waiters);
            row(
                &mut rows,
                "inversions",
                self.s4.as_ref().map_or_else(dash, f),
                seeds.and_then(|s| s.s4.as_ref()).map_or_else(dash, f),
                "0".to_owned(),
            );
        }
        if let Some(s5) = &self.s5 {
            head(
                &mut rows,
                "S5 scale: one semaphore, many holders and waiters",
            );
            for l in &s5.levels {
                row(
                    &mut rows,
                    &format!("cycle at {} holders p50 / p99", num(l.holders as f64)),
                    format!("{} / {}", us(l.run.cycle.p50_us), us(l.run.cycle.p99_us)),
                    dash(),
                    l.run.two_raw_evalsha.as_ref().map_or_else(dash, |y| {
                        format!("{} / {} (2 EVALSHA)", us(y.p50_us), us(y.p99_us))
                    }),
                );
            }
            row(
                &mut rows,
                &format!("{} waiting tasks: connections", num(s5.waiters as f64)),
                format!(
                    "{} normal + {} pub/sub",
                    s5.connections.normal, s5.connections.pubsub
                ),
                dash(),
                dash(),
            );
            row(
                &mut rows,
                "    process RSS before → waiting",
                format!(
                    "{:.1} → {:.1} MiB ({} B per waiter)",
                    s5.rss_before_bytes as f64 / 1048576.0,
                    s5.rss_waiting_bytes as f64 / 1048576.0,
                    num(s5.rss_per_waiter_bytes)
                ),
                dash(),
                dash(),
            );
        }
        if let Some(s6) = &self.s6 {
            head(&mut rows, "S6 Redis cost");
            row(
                &mut rows,
                "client commands per uncontended cycle",
                format!("{:.2}", s6.redsem.client_commands_per_cycle),
                format!("{:.2}", s6.seeds.client_commands_per_cycle),
                dash(),
            );
            row(
                &mut rows,
                "round trips per uncontended cycle",
                format!("{:.2}", s6.redsem.round_trips_per_cycle),
                format!("{:.2}", s6.seeds.round_trips_per_cycle),
                dash(),
            );
            row(
                &mut rows,
                "calls inside scripts per cycle",
                format!("{:.1}", s6.redsem.script_calls_per_cycle),
                format!("{:.1}", s6.seeds.script_calls_per_cycle),
                dash(),
            );
            for t in s6.redsem_script_times.iter().chain(&s6.raw_evalsha_time) {
                row(
                    &mut rows,
                    &format!("server time of {} (SLOWLOG) mean / p50", t.operation),
                    format!("{:.1} µs / {:.0} µs", t.mean_us, t.p50_us),
                    dash(),
                    dash(),
                );
            }
            let m = &s6.memory;
            row(
                &mut rows,
                "memory per live holder (keys / used_memory)",
                format!(
                    "{} B / {} B",
                    num(m.per_holder_keys),
                    num(m.per_holder_used_memory)
                ),
                dash(),
                dash(),
            );
            row(
                &mut rows,
                "memory per waiter (keys / used_memory)",
                format!(
                    "{} B / {} B",
                    num(m.per_waiter_keys),
                    num(m.per_waiter_used_memory)
                ),
                dash(),
                dash(),
            );
            row(
                &mut rows,
                "memory per idle semaphore (keys / used_memory)",
                format!(
                    "{} B / {} B ({:.0} keys)",
                    num(m.per_idle_keys),
                    num(m.per_idle_used_memory),
                    m.keys_per_idle
                ),
                dash(),
                dash(),
            );
        }
        if let Some(raw) = raw {
            head(
                &mut rows,
                "S8 raw limit: EVALSHA `return 1` and PING, same server",
            );
            for p in &raw.points {
                row(
                    &mut rows,
                    &format!("{} tasks, {} connection(s)", p.tasks, p.connections),
                    dash(),
                    dash(),
                    format!(
                        "{} EVALSHA/s, {} PING/s",
                        num(p.evalsha_per_s),
                        num(p.ping_per_s)
                    ),
                );
            }
        }
        if let Some(pl) = &self.permit_and_latch {
            head(
                &mut rows,
                "PermitSemaphore and CountDownLatch: S1 and S3 equivalents",
            );
            for (what, run) in [
                ("permits try_acquire(1) + release(1)", &pl.permits_s1),
                ("latch try_set_count(1) + count_down()", &pl.latch_s1),
            ] {
                if let Some(r) = run {
                    row(
                        &mut rows,
                        &format!("{what}: cycles/s, p50 / p99"),
                        format!(
                            "{}, {} / {} ({:.2} EVALSHA)",
                            num(r.cycles_per_s),
                            us(r.cycle.p50_us),
                            us(r.cycle.p99_us),
                            r.server.evalsha_per_cycle
                        ),
                        dash(),
                        r.two_raw_evalsha.as_ref().map_or_else(dash, |l| {
                            format!("{} / {} (2 EVALSHA)", us(l.p50_us), us(l.p99_us))
                        }),
                    );
                }
            }
            for (what, run) in [
                ("permits release(1) → waiting acquire(1)", &pl.permits_s3),
                ("latch count_down() → waiting wait()", &pl.latch_s3),
            ] {
                if let Some(h) = run {
                    row(
                        &mut rows,
                        &format!("{what}: p50 / p99"),
                        format!(
                            "{} / {} ({} trials)",
                            us(h.handoff.p50_us),
                            us(h.handoff.p99_us),
                            h.trials
                        ),
                        dash(),
                        dash(),
                    );
                }
            }
        }

        let mut out = String::new();
        let header = [
            "scenario / figure",
            "redsem",
            "seeds' algorithm (S7)",
            "raw limit (S8)",
            "",
        ];
        let widths: Vec<usize> = (0..4)
            .map(|i| {
                rows.iter()
                    .filter(|r| !r[1].is_empty() || i == 0 && r[0].starts_with("  "))
                    .map(|r| r[i].chars().count())
                    .chain([header[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().take(4).enumerate() {
                let pad = widths[i].saturating_sub(c.chars().count());
                let _ = write!(s, "{c}{}  ", " ".repeat(pad));
            }
            s.trim_end().to_owned()
        };
        let _ = writeln!(out, "{}", line(&header.map(str::to_owned)));
        let _ = writeln!(out, "{}", "-".repeat(widths.iter().sum::<usize>() + 6));
        for r in &rows {
            if r[1].is_empty() && !r[0].starts_with("  ") {
                let _ = writeln!(out, "{}", r[0]);
            } else {
                let _ = writeln!(out, "{}", line(r));
            }
        }
        let _ = writeln!(out, "\nTargets (issue 6)");
        for t in targets {
            let verdict = match t.met {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "not measured",
            };
            let _ = writeln!(
                out,
                "  {:<3} {:<12} {} — {}",
                t.scenario, verdict, t.target, t.figure
            );
        }
        let _ = writeln!(out, "\nInvariants (a violation fails the run)");
        for i in invariants {
            let _ = writeln!(
                out,
                "  {:<3} {:<9} {}",
                i.scenario,
                if i.held { "held" } else { "VIOLATED" },
                i.what
            );
        }
        out
    }
}

fn unmeasured(scenario: &'static str, target: &str) -> Target {
    Target {
        scenario,
        target: target.to_owned(),
        figure: "—".to_owned(),
        met: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(num(1234567.4), "1,234,567");
        assert_eq!(num(999.0), "999");
        assert_eq!(num(-1234.0), "-1,234");
        assert_eq!(num(-123.0), "-123");
    }
}
