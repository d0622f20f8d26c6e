//! The sections of the printed table, one method a scenario, and the targets and invariants
//! printed below it.

use std::fmt::Write as _;

use super::table::{Table, dash};
use super::{BaselineRun, Figures, Invariant, Target, find, num, pct, us, us1};
use crate::core::{ContendedRun, CycleRun, FairnessRun, HandoffRun};
use crate::cost::Wire;
use crate::many::ManyRun;
use crate::stats::Latency;
use crate::steady::{FirstLast, SteadyRun, Window};

/// "p50 / p99" of `l`.
fn p50_p99(l: &Latency) -> String {
    format!("{} / {}", us(l.p50_us), us(l.p99_us))
}

/// The raw-limit cell of two raw EVALSHA round trips timed alongside.
fn two_evalsha(l: &Latency) -> String {
    format!("{} (2 EVALSHA)", p50_p99(l))
}

/// A hand-off's p50 / p99 and its number of trials.
fn handoff(h: &HandoffRun) -> String {
    format!("{} ({} trials)", p50_p99(&h.handoff), h.trials)
}

/// A baseline's S2 runs, with a hold (`held`) or without.
fn contended_of(baseline: Option<&BaselineRun>, held: bool) -> &[ContendedRun] {
    match baseline {
        Some(b) if held => &b.s2_hold,
        Some(b) => &b.s2,
        None => &[],
    }
}

impl Figures {
    /// redsem's run of a scenario (`redsem`), then the seeds' and the polling baseline's.
    fn with_baselines<'a, R>(
        &'a self,
        redsem: Option<&'a R>,
        of: impl Fn(&'a BaselineRun) -> Option<&'a R>,
    ) -> [Option<&'a R>; 3] {
        [
            redsem,
            self.s7.as_ref().and_then(&of),
            self.s9.as_ref().and_then(&of),
        ]
    }

    /// S1: redsem beside the seeds' and the polling baselines, each S1 with the raw EVALSHA
    /// pairs timed alongside it.
    pub(super) fn s1_section(&self, t: &mut Table) {
        let (seeds, polling) = (self.s7.as_ref(), self.s9.as_ref());
        let runs = self.with_baselines(self.s1.as_ref(), |b| b.s1.as_ref());
        if runs.iter().all(Option::is_none) {
            return;
        }
        t.head("S1 uncontended: 1 client, capacity 5, try_acquire + release");
        let [r, s, p] = runs;
        let l = r.and_then(|r| r.two_raw_evalsha.as_ref());
        let cycles = |c: &CycleRun| num(c.cycles_per_s);
        t.row(
            "cycles/s",
            r.map_or_else(dash, |r| {
                let ratio = r.two_raw_evalsha.as_ref().map_or(String::new(), |l| {
                    format!(" ({} of raw pairs)", pct(r.cycles_per_s * l.mean_us / 1e6))
                });
                format!("{}{ratio}", num(r.cycles_per_s))
            }),
            s.map_or_else(dash, cycles),
            p.map_or_else(dash, cycles),
            l.map_or_else(dash, |l| {
                format!("{} (EVALSHA pairs/s)", num(1e6 / l.mean_us.max(1e-9)))
            }),
        );
        let raw = l.map_or_else(dash, two_evalsha);
        t.compare("cycle p50 / p99", runs, |c| p50_p99(&c.cycle), raw);
        // Each S1 times its own yardstick: the VM can change speed between scenarios.
        t.compare(
            "    2 raw EVALSHA alongside p50 / p99",
            runs,
            |c| c.two_raw_evalsha.as_ref().map_or_else(dash, p50_p99),
            dash(),
        );
        if let Some((a, b)) =
            polling.and_then(|p| p.s1_redsem_alongside.as_ref().zip(p.s1.as_ref()))
        {
            let both = |c: &CycleRun| format!("{} ({})", num(c.cycles_per_s), p50_p99(&c.cycle));
            t.row(
                "cycles/s, redsem beside polling (S9, alternating)",
                both(a),
                dash(),
                both(b),
                a.two_raw_evalsha.as_ref().map_or_else(dash, two_evalsha),
            );
        }
        t.compare(
            "Redis CPU per cycle (INFO cpu)",
            runs,
            |c| us1(c.server.redis_cpu_us_per_cycle),
            dash(),
        );
        t.compare(
            "    of it in commands (INFO commandstats)",
            runs,
            |c| us1(c.server.command_usec_per_cycle),
            dash(),
        );
        t.compare(
            "commands Redis runs per cycle",
            runs,
            |c| format!("{:.1}", c.server.commands_per_cycle),
            dash(),
        );
        t.row(
            "round trips per cycle",
            r.map_or_else(dash, |r| format!("{:.2}", r.server.evalsha_per_cycle)),
            seeds
                .filter(|s| s.s1.is_some())
                .map_or_else(dash, |s| format!("{:.2}", s.s1_round_trips_per_cycle)),
            polling
                .filter(|p| p.s1.is_some())
                .map_or_else(dash, |p| format!("{:.2}", p.s1_round_trips_per_cycle)),
            dash(),
        );
    }

    /// S2 with every holder releasing at once (`held` false) or holding first (`held` true):
    /// a block of rows for each (tasks, clients) point any algorithm ran.
    pub(super) fn s2_section(&self, t: &mut Table, held: bool) {
        let all: [&[ContendedRun]; 3] = [
            if held { &self.s2_hold } else { &self.s2 },
            contended_of(self.s7.as_ref(), held),
            contended_of(self.s9.as_ref(), held),
        ];
        let mut points: Vec<(usize, usize)> = all
            .into_iter()
            .flatten()
            .map(|r| (r.tasks, r.clients))
            .collect();
        points.sort_unstable();
        points.dedup();
        if points.is_empty() {
            return;
        }
        let hold_ms = all
            .into_iter()
            .flatten()
            .map(|r| r.hold_ms)
            .next()
            .unwrap_or_default();
        t.head(&if held {
            format!(
                "S2 contended, hold {hold_ms} ms: capacity 8, acquire (waiting) + sleep + release"
            )
        } else {
            "S2 contended: capacity 8, acquire (waiting) + release".to_owned()
        });
        for (tasks, clients) in points {
            let runs = all.map(|runs| find(runs, tasks, clients));
            let [r, s, p] = runs;
            let l = self.s8.as_ref().and_then(|r| r.point(tasks, clients));
            let cycles = |c: &ContendedRun| num(c.cycles_per_s);
            t.row(
                &format!("{tasks} tasks, {clients} client(s): cycles/s"),
                r.map_or_else(dash, |r| {
                    let ratio = l.map_or(String::new(), |l| {
                        format!(" ({} of raw)", pct(r.cycles_per_s / l.evalsha_per_s))
                    });
                    format!("{}{ratio}", num(r.cycles_per_s))
                }),
                s.map_or_else(dash, cycles),
                p.map_or_else(dash, cycles),
                l.map_or_else(dash, |l| format!("{} EVALSHA/s", num(l.evalsha_per_s))),
            );
            let raw = l.map_or_else(dash, |l| format!("{} per EVALSHA", p50_p99(&l.evalsha)));
            t.compare("    wait p50 / p99", runs, |c| p50_p99(&c.wait), raw);
            let most = |c: &ContendedRun| c.max_holders.to_string();
            t.compare("    max holders seen (≤ 8)", runs, most, dash());
            let load = |c: &ContendedRun| {
                format!(
                    "{:.1}; {}, {}",
                    c.server.commands_per_cycle,
                    us1(c.server.redis_cpu_us_per_cycle),
                    pct(c.server.redis_cpu_share)
                )
            };
            t.row(
                "    commands per cycle; Redis CPU per cycle, busy",
                r.map_or_else(dash, |r| {
                    let calls = r.server.evalsha_per_cycle;
                    format!("{} ({calls:.2} script calls)", load(r))
                }),
                s.map_or_else(dash, load),
                p.map_or_else(dash, load),
                dash(),
            );
        }
    }

    /// S3: the hand-off latency of each algorithm.
    pub(super) fn s3_section(&self, t: &mut Table) {
        let runs = self.with_baselines(self.s3.as_ref(), |b| b.s3.as_ref());
        if runs.iter().any(Option::is_some) {
            t.head("S3 hand-off: capacity 1, release → waiter's grant");
            let raw = self.s8.as_ref().and_then(|r| r.point(1, 1));
            let raw = raw.map_or_else(dash, |l| {
                format!("{} (2 EVALSHA)", us(2.0 * l.evalsha.p50_us))
            });
            t.compare("p50 / p99", runs, handoff, raw);
        }
    }

    /// S4: each algorithm's inversions against arrival order.
    pub(super) fn s4_section(&self, t: &mut Table) {
        let runs = self.with_baselines(self.s4.as_ref(), |b| b.s4.as_ref());
        if runs.iter().any(Option::is_some) {
            t.head("S4 fairness: waiters enqueued in a known order");
            let f = |r: &FairnessRun| format!("{} of {} waiters", r.inversions, r.waiters);
            t.compare("inversions", runs, f, "0".to_owned());
        }
    }

    /// S10: many waiters, redsem beside the polling baseline.
    pub(super) fn s10_section(&self, t: &mut Table) {
        let Some(s10) = &self.s10 else {
            return;
        };
        let (r, p) = (&s10.redsem, &s10.polling);
        t.head(&format!(
            "S10 many waiters: {} tasks on {} clients, capacity {}, hold {} ms, {} s",
            num(r.tasks as f64),
            r.clients,
            r.capacity,
            r.hold_ms,
            r.elapsed_s
        ));
        let row = |t: &mut Table, figure: &str, f: &dyn Fn(&ManyRun) -> String| {
            t.row(figure, f(r), dash(), f(p), dash());
        };
        row(t, "cycles/s (of the ceiling capacity ÷ hold)", &|m| {
            format!(
                "{} ({} of {})",
                num(m.cycles_per_s),
                pct(m.cycles_per_s / m.ceiling_per_s.max(1e-9)),
                num(m.ceiling_per_s)
            )
        });
        row(t, "wait p50 / p99 / max", &|m| {
            format!(
                "{} / {} / {}",
                us(m.wait.p50_us),
                us(m.wait.p99_us),
                us(m.wait.max_us)
            )
        });
        row(t, "tasks never granted; waiting at the end", &|m| {
            format!("{}; {}", m.never_granted, m.waiting_at_end)
        });
        row(t, "Redis CPU share (INFO cpu)", &|m| pct(m.redis_cpu_share));
        row(t, "commands/s (total; sent by clients)", &|m| {
            format!(
                "{}; {}",
                num(m.commands_per_s),
                num(m.client_commands_per_s)
            )
        });
        row(t, "max holders seen", &|m| {
            format!("{} (≤ {})", m.max_holders, m.capacity)
        });
    }

    /// S5: the cycle at each level of holders, and what many waiters cost this process.
    pub(super) fn s5_section(&self, t: &mut Table) {
        if let Some(s5) = &self.s5 {
            t.head("S5 scale: one semaphore, many holders and waiters");
            for l in &s5.levels {
                t.row(
                    &format!("cycle at {} holders p50 / p99", num(l.holders as f64)),
                    p50_p99(&l.run.cycle),
                    dash(),
                    dash(),
                    l.run
                        .two_raw_evalsha
                        .as_ref()
                        .map_or_else(dash, two_evalsha),
                );
            }
            t.redsem_row(
                &format!("{} waiting tasks: connections", num(s5.waiters as f64)),
                format!(
                    "{} normal + {} pub/sub",
                    s5.connections.normal, s5.connections.pubsub
                ),
            );
            t.redsem_row(
                "    process RSS before → waiting",
                format!(
                    "{:.1} → {:.1} MiB ({} B per waiter)",
                    s5.rss_before_bytes as f64 / 1048576.0,
                    s5.rss_waiting_bytes as f64 / 1048576.0,
                    num(s5.rss_per_waiter_bytes)
                ),
            );
        }
    }

    /// S6: commands, server time and memory of redsem (and the seeds' commands).
    pub(super) fn s6_section(&self, t: &mut Table) {
        if let Some(s6) = &self.s6 {
            t.head("S6 Redis cost");
            let wires = [Some(&s6.redsem), Some(&s6.seeds), None];
            let client = |w: &Wire| format!("{:.2}", w.client_commands_per_cycle);
            t.compare(
                "client commands per uncontended cycle",
                wires,
                client,
                dash(),
            );
            let trips = |w: &Wire| format!("{:.2}", w.round_trips_per_cycle);
            t.compare("round trips per uncontended cycle", wires, trips, dash());
            let calls = |w: &Wire| format!("{:.1}", w.script_calls_per_cycle);
            t.compare("calls inside scripts per cycle", wires, calls, dash());
            for c in s6.redsem_script_times.iter().chain(&s6.raw_evalsha_time) {
                t.redsem_row(
                    &format!("server time of {} (SLOWLOG) mean / p50", c.operation),
                    format!("{:.1} µs / {:.0} µs", c.mean_us, c.p50_us),
                );
            }
            let m = &s6.memory;
            t.redsem_row(
                "memory per live holder (keys / used_memory)",
                format!(
                    "{} B / {} B",
                    num(m.per_holder_keys),
                    num(m.per_holder_used_memory)
                ),
            );
            t.redsem_row(
                "memory per waiter (keys / used_memory)",
                format!(
                    "{} B / {} B",
                    num(m.per_waiter_keys),
                    num(m.per_waiter_used_memory)
                ),
            );
            t.redsem_row(
                "memory per idle semaphore (keys / used_memory)",
                format!(
                    "{} B / {} B ({:.0} keys)",
                    num(m.per_idle_keys),
                    num(m.per_idle_used_memory),
                    m.keys_per_idle
                ),
            );
        }
    }

    /// S8: the raw EVALSHA and PING limit at each point.
    pub(super) fn s8_section(&self, t: &mut Table) {
        if let Some(raw) = &self.s8 {
            t.head("S8 raw limit: EVALSHA `return 1` and PING, same server");
            for p in &raw.points {
                t.row(
                    &format!("{} tasks, {} connection(s)", p.tasks, p.connections),
                    dash(),
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
    }

    /// The permit semaphore's and the latch's S1 and S3 equivalents.
    pub(super) fn counters_section(&self, t: &mut Table) {
        if let Some(pl) = &self.permit_and_latch {
            t.head("PermitSemaphore and CountDownLatch: S1 and S3 equivalents");
            for (what, run) in [
                ("permits try_acquire(1) + release(1)", &pl.permits_s1),
                ("latch try_set_count(1) + count_down()", &pl.latch_s1),
            ] {
                if let Some(r) = run {
                    t.row(
                        &format!("{what}: cycles/s, p50 / p99"),
                        format!(
                            "{}, {} ({:.2} script calls)",
                            num(r.cycles_per_s),
                            p50_p99(&r.cycle),
                            r.server.evalsha_per_cycle
                        ),
                        dash(),
                        dash(),
                        r.two_raw_evalsha.as_ref().map_or_else(dash, two_evalsha),
                    );
                }
            }
            if let Some(c) = &pl.permits_s2 {
                t.row(
                    "permits 64 tasks, 1 client, 8 permits, acquire(1) + release(1): cycles/s",
                    format!(
                        "{} ({:.2} script calls, {:.1} µs in commands per cycle)",
                        num(c.cycles_per_s),
                        c.server.evalsha_per_cycle,
                        c.server.command_usec_per_cycle
                    ),
                    dash(),
                    dash(),
                    dash(),
                );
            }
            for (what, run) in [
                ("permits release(1) → waiting acquire(1)", &pl.permits_s3),
                ("latch count_down() → waiting wait()", &pl.latch_s3),
            ] {
                if let Some(h) = run {
                    t.redsem_row(&format!("{what}: p50 / p99"), handoff(h));
                }
            }
        }
    }
}

impl Figures {
    /// S11: the lease semaphore's and the permit semaphore's steady runs.
    pub(super) fn s11_section(&self, t: &mut Table) {
        let Some(s11) = &self.s11 else {
            return;
        };
        let l = &s11.lease;
        t.head(&format!(
            "S11 steady state: {} clients × {} tasks, capacity {}, uncontended cycles for {:.0} s",
            l.clients, l.tasks_per_client, l.capacity, l.elapsed_s
        ));
        for (what, run) in [
            ("lease try_acquire + release", &s11.lease),
            ("permits try_acquire(1) + release(1)", &s11.permits),
        ] {
            steady_rows(t, what, run);
        }
    }
}

/// The rows of one S11 run.
fn steady_rows(t: &mut Table, what: &str, run: &SteadyRun) {
    const MB: f64 = 1_048_576.0;
    t.redsem_row(
        &format!("{what}: cycles/s"),
        format!(
            "{} ({} cycles)",
            num(run.cycles_per_s),
            num(run.cycles as f64)
        ),
    );
    t.redsem_row(
        "    Redis used_memory start → end",
        format!(
            "{:.1} → {:.1} MB ({:+.1} MB)",
            run.used_memory_start_bytes as f64 / MB,
            run.used_memory_end_bytes as f64 / MB,
            run.used_memory_growth_mb
        ),
    );
    for k in &run.keys {
        let part = k.key.rsplit_once("}:").map_or(k.key.as_str(), |(_, p)| p);
        t.redsem_row(
            &format!("    key {part} at the end ({})", k.kind),
            format!(
                "{} {} ({:.1} MB)",
                num(k.size as f64),
                match (k.kind.as_str(), k.size) {
                    ("string", 1) => "byte",
                    ("string", _) => "bytes",
                    _ => "entries",
                },
                k.memory_bytes as f64 / MB
            ),
        );
    }
    if let (Some(first), Some(last)) = (run.windows.first(), run.windows.last()) {
        let span = |w: &Window| {
            // Whole seconds for the full run's 10 s windows, hundredths for the smoke's.
            let digits = if w.to_s - w.from_s >= 2.0 { 0 } else { 2 };
            format!("{:.digits$}–{:.digits$} s", w.from_s, w.to_s)
        };
        let first_last = |f: &FirstLast| {
            format!(
                "{} / {} ({:.2}×)",
                us1(f.first_us),
                us1(f.last_us),
                f.last_over_first
            )
        };
        t.redsem_row(
            &format!(
                "    Redis CPU per cycle (INFO cpu), {} / {}",
                span(first),
                span(last)
            ),
            first_last(&run.cpu_us_per_cycle),
        );
        t.redsem_row(
            "    server time in scripts (INFO commandstats), same windows",
            first_last(&run.command_us_per_cycle),
        );
        t.redsem_row(
            "    cycles/s, same windows",
            format!("{} / {}", num(first.cycles_per_s), num(last.cycles_per_s)),
        );
    }
}

/// The targets, by issue, and the invariants, printed below the table.
pub(super) fn footer(out: &mut String, targets: &[Target], invariants: &[Invariant]) {
    for (issue, title) in [
        (6, "Targets (issue 6)"),
        (
            10,
            "Targets (issue 10: redsem against the polling baseline, same run)",
        ),
        (
            19,
            "Targets (issue 19: many waiters, redsem against the polling baseline, same run)",
        ),
        (
            27,
            "Targets (issue 27: steady state, memory and server time that do not grow)",
        ),
        (
            35,
            "Targets (issue 35: noisy neighbour, fair shares against the plain FIFO, same run)",
        ),
    ] {
        let _ = writeln!(out, "\n{title}");
        for t in targets.iter().filter(|t| t.issue == issue) {
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
}
