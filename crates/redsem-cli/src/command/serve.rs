//! `redsem serve [--listen ADDR] [NAME...]`: `/metrics` in the Prometheus text format and `/`,
//! a status page that refreshes by itself, both read from Redis with the status scripts at
//! each request (one `SCAN` for the names, one script per semaphore).
//!
//! A Redis that cannot be reached at start does not stop it: it serves `redsem_up 0` and a
//! page that says so, and connects again every [`RECONNECT`] until Redis answers.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use redsem::{Redsem, ServingEngine, Status};

use super::status::{Shown, tenant_name};
use crate::context::Context;
use crate::error::{CliError, exit};
use crate::output::duration;
use crate::signals::Signals;
use crate::values;

const EXAMPLES: &str = "\
Examples:
  redsem serve                              # http://127.0.0.1:9464/
  redsem serve --listen 0.0.0.0:9464 nightly-export gpu-jobs
  curl -s http://127.0.0.1:9464/metrics

Routes:
  /             the holders (token, slot, holder, lease left) and the queue, in
                order, of each lease semaphore; the page refreshes by itself
  /metrics      Prometheus text: per semaphore redsem_semaphore_capacity,
                _used, _holders, _waiters, _oldest_wait_seconds,
                _next_lease_end_seconds; redsem_up (Redis answered);
                redsem_engine{engine=\"native\"} and {engine=\"scripts\"}
                (1 for the engine that serves: redsem's Redis module, or the
                Lua scripts); while tenants hold or wait, redsem_tenant_used
                and redsem_tenant_waiters per semaphore and tenant (the 100
                busiest tenants of a semaphore; the rest summed as tenant=\"*\")
  /status.json  each lease semaphore as `redsem status NAME --json` shows it
                (with the permits and the latch of its name, and the engine)

Each request reads Redis: one SCAN for the names (none when NAMEs are given) and
one status script per semaphore (for /status.json three reads, at once: the
semaphore, the permits and the latch). Without NAMEs every lease semaphore under
the prefix is shown: give NAMEs to bound the series a scrape makes.

If Redis cannot be reached at start, serve starts anyway: /metrics says
redsem_up 0, the page and /status.json (503) say why, and it connects again every
second until Redis answers. The page names the server (--url, its password
hidden) and the prefix.

Exit codes: 0 stopped by a signal · 1 cannot listen · 2 usage error · 78 server
not suitable (at start)";

/// Serve /metrics (Prometheus) and a live status page of the lease semaphores over HTTP
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES)]
pub(crate) struct Args {
    /// The address to listen on (a port of 0 picks a free one)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    listen: SocketAddr,

    /// How often the page refreshes itself
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = values::duration)]
    refresh: Duration,

    /// Show only these semaphores [default: every one under the prefix]
    #[arg(value_name = "NAME", value_parser = values::name)]
    names: Vec<String>,
}

/// How long to wait between attempts to connect to a Redis that could not be reached (the
/// messages say "every second").
const RECONNECT: Duration = Duration::from_secs(1);

/// What the handlers share.
struct Served {
    /// The client, once Redis answered (at start or at a later attempt).
    redsem: OnceLock<Redsem>,
    /// Why there is no client yet: the last attempt's failure, in one line.
    unreachable: Mutex<String>,
    /// `--url`, its password hidden.
    server: String,
    prefix: String,
    names: Vec<String>,
    refresh: Duration,
}

impl Served {
    fn unreachable(&self) -> String {
        self.unreachable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_unreachable(&self, why: String) {
        *self
            .unreachable
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = why;
    }
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let served = Arc::new(Served {
            redsem: OnceLock::new(),
            unreachable: Mutex::new(String::new()),
            server: ctx.redacted_url(),
            prefix: ctx.prefix().to_owned(),
            names: self.names,
            refresh: self.refresh,
        });
        // Only an unreachable Redis is waited out: a usage error or an unsuitable server
        // (exit 78) ends it here.
        match ctx.connect().await {
            Ok(redsem) => {
                let _ = served.redsem.set(redsem);
            }
            Err(err) if err.code() == exit::UNAVAILABLE => {
                eprintln!("redsem: {err}; serving anyway (redsem_up 0), trying again every second");
                served.set_unreachable(err.to_string());
            }
            Err(err) => return Err(err),
        }
        let mut signals = Signals::install()?;
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|e| {
                CliError::new(
                    exit::FAILURE,
                    format!("cannot listen on {}: {e}", self.listen),
                )
            })?;
        let bound = listener.local_addr().unwrap_or(self.listen);
        let app = Router::new()
            .route("/", get(page))
            .route("/metrics", get(metrics))
            .route("/status.json", get(json))
            .with_state(Arc::clone(&served));
        eprintln!(
            "redsem: serving http://{bound}/ (metrics at http://{bound}/metrics), reading {}",
            ctx.server()
        );
        let stop = async move {
            let signal = signals.recv().await;
            tracing::info!(signal = signal.as_str(), "stopping");
        };
        let serving = axum::serve(listener, app).with_graceful_shutdown(stop);
        tokio::select! {
            outcome = serving => outcome.map_err(|e| {
                CliError::new(exit::FAILURE, format!("the HTTP server failed: {e}"))
            })?,
            never = connect_until_up(ctx, &served) => match never {},
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Connect every [`RECONNECT`] while `served` has no client, keeping the last failure for
/// the page; once connected, wait forever (the client reconnects by itself from then on).
async fn connect_until_up(ctx: &Context, served: &Served) -> std::convert::Infallible {
    while served.redsem.get().is_none() {
        tokio::time::sleep(RECONNECT).await;
        match ctx.connect().await {
            Ok(redsem) => {
                let _ = served.redsem.set(redsem);
                eprintln!("redsem: Redis at {} answers now", served.server);
            }
            Err(err) => {
                tracing::info!(%err, "Redis still unreachable");
                served.set_unreachable(err.to_string());
            }
        }
    }
    std::future::pending().await
}

/// One read of every semaphore shown (or why it failed, in one line), and how long it took:
/// each one's [`Status`] for the metrics and the page, its [`redsem::StatusReport`] for the JSON.
struct Snapshot<T = Status> {
    semaphores: Result<Vec<(String, T)>, String>,
    took: Duration,
    /// The engine that serves the client, once connected.
    engine: Option<ServingEngine>,
}

/// Every semaphore's [`Status`]: one status script each.
async fn snapshot(served: &Served) -> Snapshot {
    // The capacity only matters when acquiring: status reads the one stored.
    read_each(served, async |redsem, name| {
        redsem.lease_semaphore(name, 1)?.status().await
    })
    .await
}

/// Every semaphore shown, each read with `read`.
async fn read_each<T>(
    served: &Served,
    read: impl AsyncFn(&Redsem, &str) -> redsem::Result<T>,
) -> Snapshot<T> {
    let started = Instant::now();
    let Some(redsem) = served.redsem.get() else {
        return Snapshot {
            semaphores: Err(format!(
                "{} (trying again every second)",
                served.unreachable()
            )),
            took: started.elapsed(),
            engine: None,
        };
    };
    let semaphores = async {
        let names = if served.names.is_empty() {
            redsem.lease_semaphore_names().await?
        } else {
            served.names.clone()
        };
        let mut all = Vec::with_capacity(names.len());
        for name in names {
            let read = read(redsem, &name).await?;
            all.push((name, read));
        }
        Ok(all)
    }
    .await
    .map_err(|err: redsem::Error| {
        format!(
            "Redis at {} did not answer: {}",
            served.server,
            crate::error::chain(&err)
        )
    });
    Snapshot {
        semaphores,
        took: started.elapsed(),
        engine: Some(redsem.engine()),
    }
}

async fn metrics(State(served): State<Arc<Served>>) -> Response {
    let snap = snapshot(&served).await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        prometheus(&snap),
    )
        .into_response()
}

async fn json(State(served): State<Arc<Served>>) -> Response {
    // Each entry is an entry of `status --json`: the library's report, and the server.
    let snap = read_each(&served, Redsem::status_report).await;
    match (&snap.semaphores, &snap.engine) {
        (Ok(all), Some(engine)) => {
            let entries: Vec<Shown<'_>> = all
                .iter()
                .map(|(_, report)| Shown::new(report, &served.server, engine))
                .collect();
            axum::Json(entries).into_response()
        }
        (Err(err), _) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
        // Read with a client: never.
        (Ok(_), None) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

async fn page(State(served): State<Arc<Served>>) -> Response {
    let snap = snapshot(&served).await;
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html(&snap, &served.server, &served.prefix, served.refresh),
    )
        .into_response()
}

/// A label value in the text format: `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition of `snap`.
fn prometheus(snap: &Snapshot) -> String {
    let mut out = String::new();
    let mut family = |name: &str, help: &str, rows: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (labels, value) in rows {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let up = f64::from(u8::from(snap.semaphores.is_ok()));
    family(
        "redsem_up",
        "Whether Redis answered this scrape (1) or not (0).",
        &[(String::new(), up)],
    );
    family(
        "redsem_scrape_duration_seconds",
        "Time this scrape took to read Redis.",
        &[(String::new(), snap.took.as_secs_f64())],
    );
    if let Some(engine) = &snap.engine {
        let rows: Vec<(String, f64)> = ["native", "scripts"]
            .into_iter()
            .map(|name| {
                let serves = f64::from(u8::from(engine.name() == name));
                (format!("{{engine=\"{name}\"}}"), serves)
            })
            .collect();
        family(
            "redsem_engine",
            "The engine that serves (1): native, redsem's Redis module, or scripts, the Lua library.",
            &rows,
        );
    }
    let Ok(all) = &snap.semaphores else {
        return out;
    };
    let per = |value: &dyn Fn(&Status) -> Option<f64>| -> Vec<(String, f64)> {
        all.iter()
            .filter_map(|(name, status)| {
                value(status).map(|v| (format!("{{name=\"{}\"}}", label(name)), v))
            })
            .collect()
    };
    family(
        "redsem_semaphores",
        "Lease semaphores shown.",
        &[(String::new(), all.len() as f64)],
    );
    family(
        "redsem_semaphore_capacity",
        "Capacity in force (absent when none is stored).",
        &per(&|s| s.capacity.map(f64::from)),
    );
    family(
        "redsem_semaphore_used",
        "Units held by live permits.",
        &per(&|s| Some(s.in_use as f64)),
    );
    family(
        "redsem_semaphore_holders",
        "Live permits.",
        &per(&|s| Some(s.holders.len() as f64)),
    );
    family(
        "redsem_semaphore_waiters",
        "Queued requests.",
        &per(&|s| Some(s.waiters.len() as f64)),
    );
    family(
        "redsem_semaphore_oldest_wait_seconds",
        "How long the longest-waiting request has been queued (0 with no queue).",
        &per(&|s| Some(s.oldest_wait().as_secs_f64())),
    );
    family(
        "redsem_semaphore_next_lease_end_seconds",
        "Time until the first holder's lease ends unless renewed (absent without holders).",
        &per(&|s| s.next_lease_end().map(|d| d.as_secs_f64())),
    );
    let (mut used, mut waiting) = (Vec::new(), Vec::new());
    for (name, status) in all {
        let tenants = status
            .tenants
            .iter()
            .map(|t| (t.name.as_str(), t.held, t.waiters));
        for (tenant, held, waiters) in bounded_tenants(tenants, TENANT_SERIES) {
            let labels = format!("{{name=\"{}\",tenant=\"{}\"}}", label(name), label(&tenant));
            used.push((labels.clone(), held as f64));
            waiting.push((labels, waiters as f64));
        }
    }
    if !used.is_empty() {
        family(
            "redsem_tenant_used",
            "Units held by each tenant (the 100 busiest of a semaphore; the rest as tenant=\"*\").",
            &used,
        );
        family(
            "redsem_tenant_waiters",
            "Queued requests of each tenant (the 100 busiest of a semaphore; the rest as tenant=\"*\").",
            &waiting,
        );
    }
    out
}

/// How many tenants of one semaphore get series of their own in `/metrics`: the busiest
/// (most units held, then most waiters); the others are summed under [`OTHER_TENANTS`].
const TENANT_SERIES: usize = 100;

/// The `tenant` label of the tenants past [`TENANT_SERIES`] (as the library's own metrics).
const OTHER_TENANTS: &str = redsem::OTHER_TENANTS;

/// `(tenant, held, waiters)` of each tenant, the busiest `bound` by name and the others
/// summed under [`OTHER_TENANTS`] (absent when there are none).
fn bounded_tenants<'a>(
    tenants: impl Iterator<Item = (&'a str, u64, u64)>,
    bound: usize,
) -> Vec<(String, u64, u64)> {
    let mut all: Vec<(&str, u64, u64)> = tenants.collect();
    all.sort_by(|a, b| (b.1, b.2, a.0).cmp(&(a.1, a.2, b.0)));
    let mut rows: Vec<(String, u64, u64)> = all
        .iter()
        .take(bound)
        .map(|(name, held, waiters)| (tenant_name(name).to_owned(), *held, *waiters))
        .collect();
    if all.len() > bound {
        let (held, waiters) = all[bound..]
            .iter()
            .fold((0, 0), |(h, w), t| (h + t.1, w + t.2));
        rows.push((OTHER_TENANTS.to_owned(), held, waiters));
    }
    rows
}

/// Text for HTML: `&`, `<`, `>`, `"` and `'` escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.3em}h2{font-size:1.1em;margin:1.4em 0 .3em}\
table{border-collapse:collapse;margin:.6em 0}\
caption{text-align:left;font-weight:600;color:#555;padding:.2em 0}\
th,td{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}\
th{font-weight:600;background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\
code{font-size:.9em;color:#555}.muted{color:#777}.err{color:#b00}\
.bar{display:inline-block;height:.8em;background:#4a8;vertical-align:middle}\
.free{display:inline-block;height:.8em;background:#ddd;vertical-align:middle}";

/// The status page of the semaphores under `prefix` on `server`: one section per semaphore,
/// holders and the queue in order.
fn html(snap: &Snapshot, server: &str, prefix: &str, refresh: Duration) -> String {
    let secs = refresh.as_secs().max(1);
    let mut out = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{secs}\">\
         <title>redsem: {}</title><style>{STYLE}</style></head><body>\n\
         <h1>redsem semaphores under <code>{}</code></h1>\n\
         <p class=\"muted\">Redis <code>{}</code>{}</p>\n",
        escape(prefix),
        escape(prefix),
        escape(server),
        snap.engine
            .as_ref()
            .map(|engine| format!(", engine {}", escape(&engine.to_string())))
            .unwrap_or_default()
    );
    match &snap.semaphores {
        Err(err) => {
            let _ = writeln!(out, "<p class=\"err\">{}</p>", escape(err));
        }
        Ok(all) if all.is_empty() => {
            out.push_str(
                "<p class=\"muted\">No lease semaphore has state under this prefix.</p>\n",
            );
        }
        Ok(all) => {
            for (name, status) in all {
                section(&mut out, name, status);
            }
        }
    }
    let _ = writeln!(
        out,
        "<p class=\"muted\">Read from Redis in {}; this page refreshes every {secs} s.</p>\
         </body></html>",
        duration(snap.took)
    );
    out
}

fn section(out: &mut String, name: &str, status: &Status) {
    let _ = write!(out, "<section><h2>{}</h2>\n<p>", escape(name));
    match status.capacity {
        Some(capacity) => {
            let used = status.in_use.min(u64::from(capacity));
            let width = |n: u64| n * 160 / u64::from(capacity.max(1));
            let _ = write!(
                out,
                "<span class=\"bar\" style=\"width:{}px\"></span><span class=\"free\" \
                 style=\"width:{}px\"></span> {} of {capacity} in use",
                width(used),
                width(u64::from(capacity) - used),
                status.in_use
            );
        }
        None => {
            let _ = write!(out, "{} in use (no capacity stored)", status.in_use);
        }
    }
    let _ = write!(out, " · {} waiting", status.waiters.len());
    if !status.waiters.is_empty() {
        let _ = write!(out, " · oldest wait {}", duration(status.oldest_wait()));
    }
    out.push_str("</p>\n");
    if !status.tenants.is_empty() {
        out.push_str(
            "<table class=\"tenants\"><caption>Tenants</caption><tr><th>Tenant</th><th>Held</th>\
             <th>Waiting</th><th>Weight</th><th>Cap</th></tr>\n",
        );
        for t in &status.tenants {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                escape(tenant_name(&t.name)),
                t.held,
                t.waiters,
                t.weight,
                t.cap.map_or_else(|| "-".to_owned(), |c| c.to_string())
            );
        }
        out.push_str("</table>\n");
    }
    if !status.holders.is_empty() {
        out.push_str(
            "<table class=\"holders\"><caption>Holders</caption><tr><th>Token</th><th>Slot</th><th>Holder</th>\
             <th>Lease left</th><th>Held for</th><th>Id</th></tr>\n",
        );
        for h in &status.holders {
            let slots: Vec<String> = h.slots.iter().map(u32::to_string).collect();
            let _ = writeln!(
                out,
                "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td><code>{}</code></td></tr>",
                h.token,
                slots.join(","),
                escape(h.label.as_deref().unwrap_or("-")),
                duration(h.expires_in),
                duration(h.held_for),
                escape(h.id.as_str())
            );
        }
        out.push_str("</table>\n");
    }
    if !status.waiters.is_empty() {
        out.push_str(
            "<table class=\"queue\"><caption>Queue, first in line first</caption><tr><th>#</th><th>Holder</th><th>Units</th>\
             <th>Waiting for</th><th>Id</th></tr>\n",
        );
        for (i, w) in status.waiters.iter().enumerate() {
            let _ = writeln!(
                out,
                "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td><code>{}</code></td></tr>",
                i + 1,
                escape(w.label.as_deref().unwrap_or("-")),
                w.units,
                duration(w.waiting_for),
                escape(w.id.as_str())
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_and_html_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(
            escape("<script>'x' & \"y\"</script>"),
            "&lt;script&gt;&#39;x&#39; &amp; &quot;y&quot;&lt;/script&gt;"
        );
    }

    #[test]
    fn only_the_busiest_tenants_get_series_and_the_rest_are_summed() {
        let tenants = [
            ("a", 1, 0),
            ("b", 3, 2),
            ("", 2, 0),
            ("c", 0, 5),
            ("d", 0, 1),
        ];
        let rows = bounded_tenants(tenants.into_iter(), 3);
        let rows: Vec<(&str, u64, u64)> =
            rows.iter().map(|(n, h, w)| (n.as_str(), *h, *w)).collect();
        assert_eq!(
            rows,
            [("b", 3, 2), ("(default)", 2, 0), ("a", 1, 0), ("*", 0, 6)]
        );
        let few = bounded_tenants([("a", 1, 0)].into_iter(), 3);
        assert_eq!(few, [("a".to_owned(), 1, 0)]);
    }

    #[test]
    fn an_unreachable_redis_scrapes_as_down() {
        let snap = Snapshot {
            semaphores: Err("cannot reach Redis at redis://127.0.0.1:1: refused".into()),
            took: Duration::from_millis(3),
            engine: None,
        };
        let text = prometheus(&snap);
        assert!(text.contains("\nredsem_up 0\n"), "{text}");
        assert!(!text.contains("redsem_semaphore_used"), "{text}");
        let page = html(&snap, "redis://u:***@h:1", "redsem", Duration::from_secs(2));
        assert!(
            page.contains("cannot reach Redis at redis://127.0.0.1:1"),
            "{page}"
        );
        assert!(page.contains("<code>redis://u:***@h:1</code>"), "{page}");
    }
}
