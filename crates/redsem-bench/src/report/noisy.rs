//! S12's section of the printed table and the targets of issue 35 (noisy neighbour).

use super::table::Table;
use super::targets::unmeasured;
use super::{Figures, Target, num, pct};
use crate::noisy::NoisyRun;

/// Issue 35: B's p99 wait with fair shares, at most, ms.
const S12_B_P99_MS: f64 = 50.0;
/// Issue 35: total cycles/s with fair shares, at least this fraction of the plain FIFO's.
const S12_SHARES_OVER_FIFO: f64 = 0.95;

/// "p50 / p99 / max" of a wait in ms.
fn wait_ms(p50: f64, p99: f64, max: f64) -> String {
    format!("{p50:.1} / {p99:.1} / {max:.1} ms")
}

impl Figures {
    /// S12: what tenant B waits behind tenant A's backlog, plain FIFO then fair shares.
    pub(super) fn s12_section(&self, t: &mut Table) {
        let Some(s12) = &self.s12 else {
            return;
        };
        let f = &s12.fifo;
        t.head(&format!(
            "S12 noisy neighbour: A {} tasks, B {} tasks, capacity {}, hold {} ms, {} s",
            num(f.a_tasks as f64),
            f.b_tasks,
            f.capacity,
            f.hold_ms,
            f.elapsed_s
        ));
        for run in [&s12.fifo, &s12.shares] {
            let mode = if run.mode == "fifo" {
                "plain FIFO"
            } else {
                "fair shares (weight 1 each)"
            };
            row(t, run, mode);
        }
    }

    /// Issue 35: with fair shares, B's p99 wait ≤ 50 ms, and the cycles/s at least 0.95× the
    /// plain FIFO's in the same run.
    pub(super) fn issue35_targets(&self) -> Vec<Target> {
        let Some(s12) = &self.s12 else {
            return vec![unmeasured(
                35,
                "S12",
                "noisy neighbour: B's wait p99 with shares ≤ 50 ms, cycles/s ≥ 0.95× FIFO's",
            )];
        };
        let (f, s) = (&s12.fifo, &s12.shares);
        let ratio = s.cycles_per_s / f.cycles_per_s.max(1e-9);
        vec![
            Target {
                issue: 35,
                scenario: "S12",
                target: format!(
                    "noisy neighbour: B's wait p99 with shares ≤ {S12_B_P99_MS} ms (FIFO's {:.1} ms)",
                    f.b_wait_p99_ms
                ),
                figure: format!("{:.1} ms", s.b_wait_p99_ms),
                met: Some(s.b_wait_p99_ms <= S12_B_P99_MS),
            },
            Target {
                issue: 35,
                scenario: "S12",
                target: format!(
                    "noisy neighbour: cycles/s with shares ≥ {S12_SHARES_OVER_FIFO}× FIFO's ({}/s)",
                    num(f.cycles_per_s)
                ),
                figure: format!("{}/s ({ratio:.3}×)", num(s.cycles_per_s)),
                met: Some(ratio >= S12_SHARES_OVER_FIFO),
            },
        ]
    }
}

/// The rows of one mode.
fn row(t: &mut Table, run: &NoisyRun, mode: &str) {
    t.redsem_row(
        &format!("{mode}: B's wait p50 / p99 / max"),
        wait_ms(
            run.b_wait_p50_ms,
            run.b_wait_p99_ms,
            run.b_wait.max_us / 1e3,
        ),
    );
    t.redsem_row(
        "    A's wait p50 / p99",
        format!(
            "{:.1} / {:.1} ms",
            run.a_wait.p50_us / 1e3,
            run.a_wait.p99_us / 1e3
        ),
    );
    t.redsem_row(
        "    cycles/s (A; B) of the ceiling",
        format!(
            "{} ({}; {}) of {}",
            num(run.cycles_per_s),
            num(run.a_cycles as f64 / run.elapsed_s.max(1e-9)),
            num(run.b_cycles as f64 / run.elapsed_s.max(1e-9)),
            num(run.ceiling_per_s)
        ),
    );
    t.redsem_row(
        "    A queued at the start; Redis CPU share; max holders",
        format!(
            "{}; {}; {} (≤ {})",
            run.a_queued_at_start,
            pct(run.redis_cpu_share),
            run.max_holders,
            run.capacity
        ),
    );
}
