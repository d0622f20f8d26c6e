//! `redsem status [NAME] [--json] [--watch [DUR]]`: who holds and who waits, the permits free
//! and the latch's count under NAME; without NAME, every lease semaphore. `--watch` redraws it
//! every DUR until interrupted.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use redsem::{LatchState, Redsem, Status};
use serde::Serialize;

use crate::cli::Context;
use crate::error::CliError;
use crate::output::{self, duration, millis, table};
use crate::signals::Signals;
use crate::values;

const EXAMPLES: &str = "\
Examples:
  redsem status                    # every lease semaphore under the prefix
  redsem status nightly-export     # its holders and its queue
  redsem status gpu                # permits: how many are free
  redsem status workers-ready      # latch: how many count-downs to go
  redsem status nightly-export --json
  redsem status nightly-export --watch     # redrawn every 2s until Ctrl-C
  redsem status --watch 500ms --json       # one JSON line per 500ms
  {\"name\":\"nightly-export\",\"limit\":2,\"holders\":[{\"id\":\"9f2c...\",
   \"holder\":\"web-1\",\"token\":17,\"slot\":0,\"expires_in_ms\":24100,
   \"held_for_ms\":5900}],\"waiters\":1,\"queue\":[{\"id\":\"51ab...\",
   \"holder\":null,\"units\":1,\"waiting_ms\":2300}],
   \"permits\":{\"available\":0},\"latch\":{\"state\":\"never-set\",\"count\":0}}

A NAME can be a lease semaphore (run, lock, acquire), counted permits (permits) and a latch
(latch) at once: status shows each that has state. \"limit\" is the lease semaphore's
capacity in force (null when none is stored: never used, or idle a long time); expired
holders are not listed; \"waiters\" counts the queue, \"queue\" lists it in order.
\"permits\".\"available\" may be negative, and is 0 both when never set and when all are
taken. \"latch\".\"state\" is counting, open (reached 0 within the hour) or never-set.

--watch redraws the view on a terminal (a header line says when); off a terminal
it prints each view after the last, with --json one line each. It ends with 0 at
Ctrl-C (or SIGTERM, SIGHUP); a read that fails while watching is shown and tried
again at the next turn.

Exit codes: 0 ok · 2 usage error · 69 Redis unreachable";

/// Show the holders and queue, permits and latch of NAME, or every semaphore under the prefix
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::MORE, after_long_help = EXAMPLES)]
pub(crate) struct Args {
    /// The semaphore's name [default: list them all]
    #[arg(value_name = "NAME", value_parser = values::name)]
    name: Option<String>,

    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,

    /// Show it again every DUR (default 2s) until interrupted
    #[arg(
        long,
        value_name = "DUR",
        num_args = 0..=1,
        default_missing_value = "2s",
        value_parser = values::duration
    )]
    watch: Option<Duration>,
}

/// `status NAME --json`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    name: &'a str,
    limit: Option<u32>,
    holders: Vec<HolderReport<'a>>,
    waiters: usize,
    queue: Vec<WaiterReport<'a>>,
    permits: PermitsReport,
    latch: LatchReport,
}

#[derive(Debug, Serialize)]
struct PermitsReport {
    available: i64,
}

#[derive(Debug, Serialize)]
struct LatchReport {
    state: &'static str,
    count: u64,
}

#[derive(Debug, Serialize)]
struct HolderReport<'a> {
    id: &'a str,
    holder: Option<&'a str>,
    token: u64,
    slot: u32,
    expires_in_ms: i64,
    held_for_ms: u64,
}

#[derive(Debug, Serialize)]
struct WaiterReport<'a> {
    id: &'a str,
    holder: Option<&'a str>,
    units: u32,
    waiting_ms: u64,
}

/// One line of `status --json` without NAME.
#[derive(Debug, Serialize)]
struct Summary {
    name: String,
    limit: Option<u32>,
    in_use: u64,
    waiters: usize,
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let redsem = ctx.connect().await?;
        let Some(every) = self.watch else {
            let text = self.render(&redsem).await?;
            output::print(text.trim_end())?;
            return Ok(ExitCode::SUCCESS);
        };
        let mut signals = Signals::install()?;
        let terminal = std::io::stdout().is_terminal();
        let every = every.max(Duration::from_millis(50));
        loop {
            let started = tokio::time::Instant::now();
            let text = match self.render(&redsem).await {
                Ok(text) => text,
                // Watching rides out a Redis that went away: shown, and tried again.
                Err(err) if !self.json => format!("redsem: {err}"),
                Err(err) => return Err(err),
            };
            let text = text.trim_end();
            if terminal {
                let header = format!(
                    "Every {}: redsem status {}",
                    duration(every),
                    self.name.as_deref().unwrap_or("")
                );
                // Home, clear, redraw.
                output::write(format!("\x1b[H\x1b[2J{header}\n\n{text}\n").as_bytes())?;
            } else if self.json {
                output::print(text)?;
            } else {
                output::print(&format!("{text}\n"))?;
            }
            tokio::select! {
                () = tokio::time::sleep_until(started + every) => {}
                signal = signals.recv() => {
                    tracing::debug!(signal = signal.as_str(), "watch stopped");
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
    }

    /// The view once: NAME's state, or the list of every lease semaphore.
    async fn render(&self, redsem: &Redsem) -> Result<String, CliError> {
        let text = match &self.name {
            Some(name) => {
                let all = everything(redsem, name).await?;
                if self.json {
                    output::json(&report(name, &all))?
                } else {
                    describe(name, &all)
                }
            }
            None => {
                let mut summaries = Vec::new();
                for name in redsem.lease_semaphore_names().await? {
                    let status = status_of(redsem, &name).await?;
                    summaries.push(Summary {
                        name,
                        limit: status.capacity,
                        in_use: status.in_use,
                        waiters: status.waiters.len(),
                    });
                }
                if self.json {
                    output::json(&summaries)?
                } else {
                    list(&summaries, redsem.prefix())
                }
            }
        };
        Ok(text)
    }
}

async fn status_of(redsem: &Redsem, name: &str) -> Result<Status, CliError> {
    // The capacity only matters when acquiring: `status` reads the one stored.
    Ok(redsem.lease_semaphore(name, 1)?.status().await?)
}

/// What is stored under one name: the lease semaphore, the permits and the latch.
#[derive(Debug)]
struct Everything {
    lease: Status,
    available: i64,
    latch: LatchState,
}

async fn everything(redsem: &Redsem, name: &str) -> Result<Everything, CliError> {
    let lease = status_of(redsem, name).await?;
    let available = redsem.permit_semaphore(name)?.available_permits().await?;
    let latch = redsem.count_down_latch(name)?.state().await?;
    Ok(Everything {
        lease,
        available,
        latch,
    })
}

/// Whether the lease semaphore has anything to show.
fn in_use(status: &Status) -> bool {
    status.capacity.is_some() || !status.holders.is_empty() || !status.waiters.is_empty()
}

fn report<'a>(name: &'a str, all: &'a Everything) -> Report<'a> {
    let status = &all.lease;
    let (state, count) = match all.latch {
        LatchState::NeverSet => ("never-set", 0),
        LatchState::Counting(n) => ("counting", n),
        LatchState::Done => ("open", 0),
    };
    Report {
        name,
        limit: status.capacity,
        holders: status
            .holders
            .iter()
            .map(|h| HolderReport {
                id: h.id.as_str(),
                holder: h.label.as_deref(),
                token: h.token.get(),
                slot: h.slots.first().copied().unwrap_or_default(),
                expires_in_ms: i64::try_from(h.expires_in.as_millis()).unwrap_or(i64::MAX),
                held_for_ms: millis(h.held_for),
            })
            .collect(),
        waiters: status.waiters.len(),
        queue: status
            .waiters
            .iter()
            .map(|w| WaiterReport {
                id: w.id.as_str(),
                holder: w.label.as_deref(),
                units: w.units,
                waiting_ms: millis(w.waiting_for),
            })
            .collect(),
        permits: PermitsReport {
            available: all.available,
        },
        latch: LatchReport { state, count },
    }
}

/// What a person reads at a glance: a line for each kind of state NAME has, and the tables of
/// the lease semaphore's holders and queue.
fn describe(name: &str, all: &Everything) -> String {
    let mut out = String::new();
    let latch = match all.latch {
        LatchState::NeverSet => None,
        LatchState::Counting(n) => Some(format!("{name}: latch counting, {n} to go\n")),
        LatchState::Done => Some(format!("{name}: latch open (reached 0 within the hour)\n")),
    };
    if all.available != 0 {
        out += &format!("{name}: {} permits available\n", all.available);
    }
    out += latch.as_deref().unwrap_or_default();
    if in_use(&all.lease) || out.is_empty() {
        out.insert_str(0, &lease_table(name, &all.lease, all.available));
    }
    out
}

/// The lease semaphore's line, holders and queue.
fn lease_table(name: &str, status: &Status, available: i64) -> String {
    let mut out = match status.capacity {
        Some(limit) => format!(
            "{name}: {} of {limit} in use, {} waiting\n",
            status.in_use,
            status.waiters.len()
        ),
        // Counted permits cannot tell "never set" from "all taken": both read 0.
        None if available == 0 => format!(
            "{name}: not in use (no lease semaphore or latch; permits: 0 available, never set \
             or all taken)\n"
        ),
        None => format!("{name}: not in use (no limit stored)\n"),
    };
    if !status.holders.is_empty() {
        let rows: Vec<Vec<String>> = status
            .holders
            .iter()
            .map(|h| {
                let slots: Vec<String> = h.slots.iter().map(u32::to_string).collect();
                vec![
                    label(h.label.as_deref()),
                    h.token.to_string(),
                    slots.join(","),
                    duration(h.expires_in),
                    duration(h.held_for),
                    h.id.to_string(),
                ]
            })
            .collect();
        out.push('\n');
        out += &table(
            &["HOLDER", "TOKEN", "SLOT", "LEASE LEFT", "HELD FOR", "ID"],
            &rows,
        );
    }
    if !status.waiters.is_empty() {
        let rows: Vec<Vec<String>> = status
            .waiters
            .iter()
            .enumerate()
            .map(|(i, w)| {
                vec![
                    (i + 1).to_string(),
                    label(w.label.as_deref()),
                    w.units.to_string(),
                    duration(w.waiting_for),
                    w.id.to_string(),
                ]
            })
            .collect();
        out.push('\n');
        out += &table(&["QUEUE", "HOLDER", "UNITS", "WAITING FOR", "ID"], &rows);
    }
    if !status.holders.is_empty() || !status.waiters.is_empty() {
        out.push('\n');
    }
    out
}

/// Every semaphore, one line each.
fn list(summaries: &[Summary], prefix: &str) -> String {
    if summaries.is_empty() {
        return format!("no semaphores under the prefix {prefix:?}");
    }
    let rows: Vec<Vec<String>> = summaries
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.in_use.to_string(),
                s.limit.map_or_else(|| "-".to_owned(), |c| c.to_string()),
                s.waiters.to_string(),
            ]
        })
        .collect();
    table(&["NAME", "IN USE", "LIMIT", "WAITING"], &rows)
}

fn label(label: Option<&str>) -> String {
    label.unwrap_or("-").to_owned()
}
