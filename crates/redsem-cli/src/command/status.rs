//! `redsem status [NAME] [--json] [--watch [DUR]]`: who holds and who waits, the permits free
//! and the latch's count under NAME; without NAME, every lease semaphore. `--watch` redraws it
//! every DUR until interrupted.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use redsem::{LatchState, Redsem, ServingEngine, Status, StatusReport};

use crate::context::Context;
use crate::error::CliError;
use crate::output::{self, duration, table};
use crate::signals::Signals;
use crate::values;

const EXAMPLES: &str = "\
Examples:
  redsem status                    # every semaphore, permit pool and latch
  redsem status nightly-export     # its holders and its queue
  redsem status gpu                # permits: how many are free
  redsem status workers-ready      # latch: how many count-downs to go
  redsem status nightly-export --json
  redsem status nightly-export --watch     # redrawn every 2s until Ctrl-C
  redsem status --watch 500ms --json       # one JSON line per 500ms
  {\"name\":\"nightly-export\",\"capacity\":2,\"in_use\":1,\"holders\":[{\"id\":
   \"9f2c...\",\"label\":\"web-1\",\"token\":17,\"slots\":[0],
   \"expires_in_ms\":24100,\"held_for_ms\":5900}],\"waiters\":[{\"id\":
   \"51ab...\",\"label\":null,\"units\":1,\"waiting_for_ms\":2300}],
   \"permits\":{\"available\":0},\"latch\":{\"state\":\"never-set\",\"count\":0},
   \"server\":\"redis://127.0.0.1:6379\",\"engine\":{\"name\":\"native\",
   \"version\":\"0.1.0\"}}

A NAME can be a lease semaphore (run, lock, acquire), counted permits (permits) and a latch
(latch) at once: status shows each that has state. Without NAME, --json prints a list of
these objects, one per name. Each is the library's StatusReport, the server and the engine
that serves (serve's /status.json lists the same objects): \"capacity\" is the limit in
force (null when none is stored: never used, or idle a long time); expired holders are not
listed; \"waiters\" lists the queue in order.
\"permits\".\"available\" may be negative, and is 0 both when never set and when all are
taken. \"latch\".\"state\" is counting, open (reached 0 within the hour) or never-set.
\"server\" is the --url read, its password hidden; the table's first line names it too, and
the prefix, and says when it is the default (no --url or REDIS_URL). \"engine\" is the
engine that serves the calls (--engine): {\"name\":\"native\",\"version\":...} for
redsem's Redis module, {\"name\":\"scripts\"} for the Lua scripts; the table's second line
says it (engine: native (redsem module 0.1.0), or engine: scripts).

--watch redraws the view on a terminal (a header line says when); off a terminal
it prints each view after the last, with --json one line each. It ends with 0 at
Ctrl-C (or SIGTERM, SIGHUP); a read that fails while watching is shown and tried
again at the next turn.

Exit codes: 0 ok · 2 usage error · 69 Redis unreachable";

/// Show the holders and queue, permits and latch of NAME, or list every one under the prefix
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES)]
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

/// `status NAME --json`, and each entry of `status --json` and `serve`'s `/status.json`: the
/// library's [`StatusReport`] as its `serde` feature writes it (one schema for all three, and
/// for the Python binding's `status()`), then the server read and the engine serving it.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Shown<'a> {
    #[serde(flatten)]
    report: &'a StatusReport,
    /// `--url` with any password hidden.
    server: &'a str,
    /// The engine that serves the client: `{"name":"native","version":"0.1.0"}` or
    /// `{"name":"scripts"}`.
    engine: &'a ServingEngine,
}

impl<'a> Shown<'a> {
    pub(crate) fn new(
        report: &'a StatusReport,
        server: &'a str,
        engine: &'a ServingEngine,
    ) -> Shown<'a> {
        Shown {
            report,
            server,
            engine,
        }
    }
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let redsem = ctx.connect().await?;
        let server = Server {
            url: ctx.redacted_url(),
            header: format!(
                "server {}, prefix {}\nengine: {}",
                ctx.server(),
                redsem.prefix(),
                redsem.engine()
            ),
        };
        let Some(every) = self.watch else {
            let text = self.render(&redsem, &server).await?;
            output::print(text.trim_end())?;
            return Ok(ExitCode::SUCCESS);
        };
        let mut signals = Signals::install()?;
        let terminal = std::io::stdout().is_terminal();
        let every = every.max(Duration::from_millis(50));
        loop {
            let started = tokio::time::Instant::now();
            let text = match self.render(&redsem, &server).await {
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

    /// The view once: NAME's state, or the list of every lease semaphore; the text after a
    /// line naming the server and the prefix, the JSON with the server in each object.
    async fn render(&self, redsem: &Redsem, server: &Server) -> Result<String, CliError> {
        let text = match &self.name {
            Some(name) => {
                let all = everything(redsem, name).await?;
                if self.json {
                    let engine = redsem.engine();
                    output::json(&Shown::new(&all.report, &server.url, &engine))?
                } else {
                    format!("{}\n\n{}", server.header, describe(name, &all))
                }
            }
            None => {
                let mut all = Vec::new();
                let (names, pools) = every_name(redsem).await?;
                for name in names {
                    let mut found = everything(redsem, &name).await?;
                    found.pool = pools.binary_search(&name).is_ok();
                    all.push((name, found));
                }
                if self.json {
                    let engine = redsem.engine();
                    let reports: Vec<Shown<'_>> = all
                        .iter()
                        .map(|(_, found)| Shown::new(&found.report, &server.url, &engine))
                        .collect();
                    output::json(&reports)?
                } else {
                    format!("{}\n\n{}", server.header, list(&all, redsem.prefix()))
                }
            }
        };
        Ok(text)
    }
}

/// The server a view is read from, as the JSON and the text name it.
struct Server {
    /// `--url` with any password hidden.
    url: String,
    /// The text's first lines: the server (and whether it is the default) and the prefix;
    /// the engine that serves.
    header: String,
}

/// The names of every lease semaphore, permit semaphore and latch with state, each once, and
/// those of the permit semaphores (whose count was set: a read of 0 cannot tell).
async fn every_name(redsem: &Redsem) -> Result<(Vec<String>, Vec<String>), CliError> {
    let mut names = redsem.lease_semaphore_names().await?;
    let mut pools = redsem.permit_semaphore_names().await?;
    pools.sort();
    names.extend(pools.iter().cloned());
    names.extend(redsem.count_down_latch_names().await?);
    names.sort();
    names.dedup();
    Ok((names, pools))
}

/// What is stored under one name: the lease semaphore, the permits and the latch.
#[derive(Debug)]
struct Everything {
    report: StatusReport,
    /// Whether NAME has a permit pool (its count was set): known when listing every name,
    /// otherwise only when `available` is not 0.
    pool: bool,
}

async fn everything(redsem: &Redsem, name: &str) -> Result<Everything, CliError> {
    let report = redsem.status_report(name).await?;
    Ok(Everything {
        pool: report.permits.available != 0,
        report,
    })
}

/// Whether the lease semaphore has anything to show.
fn in_use(status: &Status) -> bool {
    status.capacity.is_some() || !status.holders.is_empty() || !status.waiters.is_empty()
}

/// What a person reads at a glance: a line for each kind of state NAME has, and the tables of
/// the lease semaphore's holders and queue.
fn describe(name: &str, all: &Everything) -> String {
    let mut out = String::new();
    let available = all.report.permits.available;
    let latch = match all.report.latch {
        LatchState::NeverSet => None,
        LatchState::Counting(n) => Some(format!("{name}: latch counting, {n} to go\n")),
        LatchState::Done => Some(format!("{name}: latch open (reached 0 within the hour)\n")),
    };
    if available != 0 {
        let noun = if available.abs() == 1 {
            "permit"
        } else {
            "permits"
        };
        out += &format!("{name}: {available} {noun} available\n");
    }
    out += latch.as_deref().unwrap_or_default();
    if in_use(&all.report.lease) || out.is_empty() {
        out.insert_str(0, &lease_table(name, &all.report.lease, available));
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
    if !status.tenants.is_empty() {
        out.push('\n');
        out += &tenant_table(status);
    }
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
    if !status.holders.is_empty() || !status.waiters.is_empty() || !status.tenants.is_empty() {
        out.push('\n');
    }
    out
}

/// The tenants that hold or wait: units held, requests queued, weight and cap in force.
fn tenant_table(status: &Status) -> String {
    let rows: Vec<Vec<String>> = status
        .tenants
        .iter()
        .map(|t| {
            vec![
                tenant_name(&t.name).to_owned(),
                t.held.to_string(),
                t.waiters.to_string(),
                t.weight.to_string(),
                t.cap.map_or_else(|| "-".to_owned(), |c| c.to_string()),
            ]
        })
        .collect();
    table(&["TENANT", "HELD", "WAITING", "WEIGHT", "CAP"], &rows)
}

/// A tenant's name as shown: the default tenant (`""`, requests that name none) as
/// `(default)`.
pub(crate) fn tenant_name(name: &str) -> &str {
    if name.is_empty() { "(default)" } else { name }
}

/// Every name, one line each: its lease semaphore, permits and latch.
fn list(all: &[(String, Everything)], prefix: &str) -> String {
    if all.is_empty() {
        return format!("no semaphores, permits or latches under the prefix {prefix:?}");
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|(name, found)| {
            let lease = &found.report.lease;
            let latch = match found.report.latch {
                LatchState::NeverSet => "-".to_owned(),
                LatchState::Counting(n) => format!("{n} to go"),
                LatchState::Done => "open".to_owned(),
            };
            let used = in_use(lease);
            vec![
                name.clone(),
                if used {
                    lease.in_use.to_string()
                } else {
                    "-".to_owned()
                },
                lease
                    .capacity
                    .map_or_else(|| "-".to_owned(), |c| c.to_string()),
                if used {
                    lease.waiters.len().to_string()
                } else {
                    "-".to_owned()
                },
                if found.pool {
                    found.report.permits.available.to_string()
                } else {
                    "-".to_owned()
                },
                latch,
            ]
        })
        .collect();
    table(
        &["NAME", "IN USE", "LIMIT", "WAITING", "PERMITS", "LATCH"],
        &rows,
    )
}

fn label(label: Option<&str>) -> String {
    label.unwrap_or("-").to_owned()
}
