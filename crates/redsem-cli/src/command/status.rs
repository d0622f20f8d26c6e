//! `redsem status [NAME] [--json]`: who holds and who waits; without NAME, every semaphore.

use std::process::ExitCode;

use redsem::{Redsem, Status};
use serde::Serialize;

use crate::cli::Context;
use crate::error::CliError;
use crate::output::{self, duration, millis, table};
use crate::values;

const EXAMPLES: &str = "\
Examples:
  redsem status                      # every semaphore under the prefix, with its usage
  redsem status nightly-export       # its holders and its queue
  redsem status nightly-export --json
  {\"name\":\"nightly-export\",\"limit\":2,\"holders\":[{\"id\":\"9f2c...\",\"holder\":\"web-1\",
   \"token\":17,\"slot\":0,\"expires_in_ms\":24100}],\"waiters\":1,\"queue\":[{\"id\":\"51ab...\",
   \"holder\":null,\"units\":1,\"waiting_ms\":2300}]}

\"limit\" is the capacity in force (null when none is stored: never used, or idle a long
time); expired holders are not listed; \"waiters\" counts the queue, \"queue\" lists it in order.

Exit codes: 0 ok · 2 usage error · 69 Redis unreachable";

/// Show the holders and the queue of NAME, or every semaphore under the prefix
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub(crate) struct Args {
    /// The semaphore's name [default: list them all]
    #[arg(value_name = "NAME", value_parser = values::name)]
    name: Option<String>,

    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

/// `status NAME --json`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    name: &'a str,
    limit: Option<u32>,
    holders: Vec<HolderReport<'a>>,
    waiters: usize,
    queue: Vec<WaiterReport<'a>>,
}

#[derive(Debug, Serialize)]
struct HolderReport<'a> {
    id: &'a str,
    holder: Option<&'a str>,
    token: u64,
    slot: u32,
    expires_in_ms: i64,
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
        let text = match &self.name {
            Some(name) => {
                let status = status_of(&redsem, name).await?;
                if self.json {
                    output::json(&report(name, &status))?
                } else {
                    describe(name, &status)
                }
            }
            None => {
                let mut summaries = Vec::new();
                for name in redsem.lease_semaphore_names().await? {
                    let status = status_of(&redsem, &name).await?;
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
        println!("{}", text.trim_end());
        Ok(ExitCode::SUCCESS)
    }
}

async fn status_of(redsem: &Redsem, name: &str) -> Result<Status, CliError> {
    // The capacity only matters when acquiring: `status` reads the one stored.
    Ok(redsem.lease_semaphore(name, 1)?.status().await?)
}

fn report<'a>(name: &'a str, status: &'a Status) -> Report<'a> {
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
    }
}

/// The table a person reads at a glance.
fn describe(name: &str, status: &Status) -> String {
    let mut out = match status.capacity {
        Some(limit) => format!(
            "{name}: {} of {limit} in use, {} waiting\n",
            status.in_use,
            status.waiters.len()
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
