//! What the primitives report about themselves: metrics through the [`metrics`] facade and
//! `tracing` spans.
//!
//! See [`describe_metrics`] for the metrics and spans.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics::{Key, Label, Level, Metadata, SharedString};

use crate::error::Result;

/// The `name` label value of primitives whose names are not shown ([`MetricNames`]).
pub const HIDDEN_NAME: &str = "*";

/// How many tenant names get a `tenant` label value of their own in a process: the first this
/// many distinct names seen (by [`LeaseSemaphore::for_tenant`](crate::LeaseSemaphore::for_tenant)
/// or a [`LeaseOptions::tenant`](crate::LeaseOptions::tenant)) keep theirs for the life of the
/// process; every later one is labelled [`OTHER_TENANTS`].
pub const MAX_TENANT_LABELS: usize = 100;

/// The `tenant` label value of the tenants past the first [`MAX_TENANT_LABELS`] seen.
pub const OTHER_TENANTS: &str = "*";

/// The tenant names that have a label value of their own: the first `bound` seen.
struct TenantLabels {
    bound: usize,
    seen: Mutex<BTreeSet<Arc<str>>>,
}

impl TenantLabels {
    const fn new(bound: usize) -> TenantLabels {
        TenantLabels {
            bound,
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// The label value of `tenant`: its name if it is among the first `bound` seen (taking a
    /// place if one is left), [`OTHER_TENANTS`] otherwise.
    fn label(&self, tenant: &str) -> SharedString {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(name) = seen.get(tenant) {
            return SharedString::from_shared(name.clone());
        }
        if seen.len() < self.bound {
            let name: Arc<str> = Arc::from(tenant);
            seen.insert(name.clone());
            return SharedString::from_shared(name);
        }
        SharedString::const_str(OTHER_TENANTS)
    }
}

/// The process's tenant label values.
static TENANT_LABELS: TenantLabels = TenantLabels::new(MAX_TENANT_LABELS);

/// Which primitive names the metrics carry in their `name` label
/// ([`RedsemOptions::metric_names`](crate::RedsemOptions::metric_names)).
///
/// Every distinct label value is a time series in the monitoring system. Names that come from
/// a fixed set (`nightly-export`, `gpu`) are fine as they are ([`MetricNames::Each`], the
/// default); names made per job, per user or per request (`invoice-81723`) are not: give
/// those [`MetricNames::Hidden`], or list the few worth a series of their own with
/// [`MetricNames::only`]. A name that is not shown gets the label value [`HIDDEN_NAME`]
/// (`"*"`), so its figures still count in the totals of its primitive.
///
/// # Examples
///
/// ```
/// use redsem::{MetricNames, RedsemOptions};
/// let options = RedsemOptions::default().metric_names(MetricNames::only(["exports", "gpu"]));
/// assert!(options.metric_names.shows("gpu"));
/// assert!(!options.metric_names.shows("invoice-81723"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricNames {
    /// Every primitive's own name (the default).
    #[default]
    Each,
    /// No names: every primitive of a kind shares the label value [`HIDDEN_NAME`].
    Hidden,
    /// These names; every other one is labelled [`HIDDEN_NAME`].
    Only(BTreeSet<String>),
}

impl MetricNames {
    /// Show only `names` (see [`MetricNames::Only`]).
    pub fn only<I, S>(names: I) -> MetricNames
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MetricNames::Only(names.into_iter().map(Into::into).collect())
    }

    /// Whether metrics of the primitive `name` carry its name.
    pub fn shows(&self, name: &str) -> bool {
        match self {
            MetricNames::Each => true,
            MetricNames::Hidden => false,
            MetricNames::Only(names) => names.contains(name),
        }
    }

    fn label(&self, name: &str) -> SharedString {
        if self.shows(name) {
            SharedString::from_shared(Arc::from(name))
        } else {
            SharedString::const_str(HIDDEN_NAME)
        }
    }
}

/// Give the installed recorder the unit and description of every redsem metric.
///
/// # Metrics
///
/// Every metric goes to the recorder the program installed (`metrics-exporter-prometheus`,
/// an OpenTelemetry bridge, ...). With none installed, each call is one indirect call to the
/// facade's no-op recorder: the keys are built once per primitive handle, so nothing is
/// allocated or formatted on the way.
///
/// | metric | kind | labels | what |
/// |---|---|---|---|
/// | `redsem_acquires_total` | counter | `primitive`, `name`, `outcome` | acquire calls by how they ended: `granted`, `busy` (a `try_*` found no room), `timeout`, `cancelled` (the future was dropped), `error` |
/// | `redsem_acquire_seconds` | histogram | `primitive`, `name`, `outcome` | time from the call to its end |
/// | `redsem_queue_wait_seconds` | histogram | `primitive`, `name` | time spent queued, for acquires that queued and were granted |
/// | `redsem_hold_seconds` | histogram | `primitive`, `name` | time a lease permit was held: grant to release, drop or loss |
/// | `redsem_renewals_total` | counter | `primitive`, `name`, `outcome` | lease renewals: `ok`, `not_held` (Redis no longer had it), `error` (unreachable) |
/// | `redsem_leases_lost_total` | counter | `primitive`, `name` | permits found lost while held |
/// | `redsem_permits_released_total` | counter | `primitive`, `name` | permits given back to a permit semaphore (units) |
/// | `redsem_latch_count_downs_total` | counter | `primitive`, `name` | count-downs of a latch |
/// | `redsem_latch_waits_total` | counter | `primitive`, `name`, `outcome` | latch waits by how they ended: `opened`, `timeout`, `cancelled`, `error` |
/// | `redsem_latch_wait_seconds` | histogram | `primitive`, `name`, `outcome` | time from the wait call to its end |
/// | `redsem_tenant_acquires_total` | counter | `primitive`, `name`, `tenant`, `outcome` | acquire calls of requests that name a tenant, by tenant and outcome (as `redsem_acquires_total`, which counts them too) |
/// | `redsem_tenant_queue_wait_seconds` | histogram | `primitive`, `name`, `tenant` | time spent queued by granted acquires that name a tenant, by tenant |
/// | `redsem_pubsub_reconnects_total` | counter | | the pub/sub connection came back after a loss |
/// | `redsem_script_reloads_total` | counter | | a script was sent again after Redis answered `NOSCRIPT` (restart, failover, `SCRIPT FLUSH`) |
/// | `redsem_engine` | gauge | `engine` | clients of this process served by each engine ([`Engine`](crate::Engine)): `native` (redsem's module) or `scripts`; with one client, 1 for its engine and 0 for the other |
/// | `redsem_engine_fallbacks_total` | counter | | clients that found the module gone in a call (a failover to a server without it) and went on with the scripts |
///
/// `primitive` is `lease`, `mutex`, `permits` or `latch`. The `name` label is the
/// primitive's name unless [`MetricNames`] says otherwise: see there for bounding the label
/// cardinality.
///
/// `tenant` is the tenant's name ([`Tenant`](crate::Tenant)) for the first
/// [`MAX_TENANT_LABELS`] (100) distinct tenant names this process sees; every tenant seen
/// after those is labelled [`OTHER_TENANTS`] (`"*"`), so a gateway with a tenant per customer
/// has at most 101 tenant series per semaphore and outcome, and the figures of the rest still
/// count in the `"*"` series. Requests that name no tenant are only in the series without
/// `tenant`.
///
/// # Spans
///
/// Each operation runs in a span named after it (`redsem.acquire`, `redsem.release`,
/// `redsem.renew`, `redsem.permits.acquire`, `redsem.latch.wait`, ...) with the fields
/// `primitive`, `name`, and where they apply `units`, `id`, `token` and `outcome`. A lease
/// permit has a span of its own, `redsem.permit` (`name`, `id`, `token`, `slot`), open for as
/// long as the permit lives: its renewals, its release and its loss are recorded inside it,
/// so a subscriber that shows span lifetimes shows each permit's life.
///
/// # When to call it
///
/// [`Redsem::connect`](crate::Redsem::connect) calls it; call it again if the recorder is
/// installed after connecting (descriptions go to the recorder in place when they are given).
///
/// # Examples
///
/// ```
/// // After installing a recorder (e.g. metrics_exporter_prometheus::PrometheusBuilder):
/// redsem::describe_metrics();
/// ```
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        "redsem_acquires_total",
        "acquire calls by outcome: granted, busy, timeout, cancelled, error"
    );
    describe_histogram!(
        "redsem_acquire_seconds",
        Unit::Seconds,
        "time from an acquire call to its end, by outcome"
    );
    describe_histogram!(
        "redsem_queue_wait_seconds",
        Unit::Seconds,
        "time granted acquires spent queued"
    );
    describe_histogram!(
        "redsem_hold_seconds",
        Unit::Seconds,
        "time a lease permit was held (grant to release, drop or loss)"
    );
    describe_counter!(
        "redsem_renewals_total",
        "lease renewals by outcome: ok, not_held, error"
    );
    describe_counter!(
        "redsem_leases_lost_total",
        "lease permits found lost while held"
    );
    describe_counter!(
        "redsem_permits_released_total",
        "permits given back to a permit semaphore"
    );
    describe_counter!("redsem_latch_count_downs_total", "latch count-downs");
    describe_counter!(
        "redsem_latch_waits_total",
        "latch waits by outcome: opened, timeout, cancelled, error"
    );
    describe_histogram!(
        "redsem_latch_wait_seconds",
        Unit::Seconds,
        "time from a latch wait call to its end, by outcome"
    );
    describe_counter!(
        "redsem_tenant_acquires_total",
        "acquire calls that name a tenant, by tenant and outcome"
    );
    describe_histogram!(
        "redsem_tenant_queue_wait_seconds",
        Unit::Seconds,
        "time granted acquires that name a tenant spent queued, by tenant"
    );
    describe_counter!(
        "redsem_pubsub_reconnects_total",
        "times the pub/sub connection came back after a loss"
    );
    describe_counter!(
        "redsem_script_reloads_total",
        "scripts sent again after Redis answered NOSCRIPT"
    );
    metrics::describe_gauge!(
        "redsem_engine",
        "clients served by each engine: native (redsem's module) or scripts"
    );
    describe_counter!(
        "redsem_engine_fallbacks_total",
        "clients that found redsem's module gone and went on with the scripts"
    );
}

/// A span for one operation of the primitive whose [`Meter`] is `$meter`, named `$op`
/// (`"redsem.acquire"`), with the fields every operation span has.
macro_rules! op_span {
    ($meter:expr, $op:literal) => {
        tracing::info_span!(
            $op,
            primitive = $meter.primitive(),
            name = %$meter.name(),
            units = tracing::field::Empty,
            id = tracing::field::Empty,
            token = tracing::field::Empty,
            outcome = tracing::field::Empty,
        )
    };
}
pub(crate) use op_span;

const METADATA: Metadata<'static> = Metadata::new("redsem", Level::INFO, Some("redsem"));

/// How an acquire (or a latch wait) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted (a latch: opened).
    Done,
    Busy,
    Timeout,
    Cancelled,
    Error,
}

const OUTCOMES: [Outcome; 5] = [
    Outcome::Done,
    Outcome::Busy,
    Outcome::Timeout,
    Outcome::Cancelled,
    Outcome::Error,
];

impl Outcome {
    fn of<T>(result: &Result<T>) -> Outcome {
        match result {
            Ok(_) => Outcome::Done,
            Err(err) if err.is_timeout() => Outcome::Timeout,
            Err(err) if err.is_not_acquired() => Outcome::Busy,
            Err(_) => Outcome::Error,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn word(self, primitive: &str) -> &'static str {
        match self {
            Outcome::Done if primitive == "latch" => "opened",
            Outcome::Done => "granted",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

/// The metric keys of one primitive handle, built on first use: reporting a figure then
/// allocates nothing.
struct Keys {
    acquires: [Key; 5],
    acquire_seconds: [Key; 5],
    queue_wait: Key,
    hold: Key,
    renewals: [Key; 3],
    lost: Key,
    released: Key,
    count_downs: Key,
}

/// The per-tenant metric keys of a handle whose requests name a tenant.
struct TenantKeys {
    acquires: [Key; 5],
    queue_wait: Key,
}

/// The metrics of one primitive handle: its `primitive` and `name` labels, and the `tenant`
/// label of a handle whose requests name one.
pub(crate) struct Meter {
    primitive: &'static str,
    name: String,
    labels: [Label; 2],
    keys: OnceLock<Keys>,
    tenant: Option<Label>,
    tenant_keys: OnceLock<TenantKeys>,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("primitive", &self.primitive)
            .field("label", &self.labels[1].value())
            .finish_non_exhaustive()
    }
}

/// A renewal's outcome, for `redsem_renewals_total`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Renewal {
    Ok = 0,
    NotHeld = 1,
    Failed = 2,
}

impl Meter {
    /// The same labels for another handle on the same primitive (its keys made afresh).
    pub(crate) fn again(&self) -> Meter {
        Meter {
            primitive: self.primitive,
            name: self.name.clone(),
            labels: self.labels.clone(),
            keys: OnceLock::new(),
            tenant: self.tenant.clone(),
            tenant_keys: OnceLock::new(),
        }
    }

    /// The same meter for requests of `tenant` (none: no per-tenant series), its label value
    /// bounded by [`MAX_TENANT_LABELS`].
    pub(crate) fn with_tenant(mut self, tenant: Option<&str>) -> Meter {
        self.tenant = tenant.map(|t| Label::new("tenant", TENANT_LABELS.label(t)));
        self.tenant_keys = OnceLock::new();
        self
    }

    pub(crate) fn new(primitive: &'static str, name: &str, names: &MetricNames) -> Meter {
        Meter {
            primitive,
            name: name.to_owned(),
            labels: [
                Label::from_static_parts("primitive", primitive),
                Label::new("name", names.label(name)),
            ],
            keys: OnceLock::new(),
            tenant: None,
            tenant_keys: OnceLock::new(),
        }
    }

    pub(crate) fn primitive(&self) -> &'static str {
        self.primitive
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn key(&self, metric: &'static str, extra: Option<(&'static str, &'static str)>) -> Key {
        let mut labels = self.labels.to_vec();
        if let Some((key, value)) = extra {
            labels.push(Label::from_static_parts(key, value));
        }
        Key::from_parts(metric, labels)
    }

    fn keys(&self) -> &Keys {
        self.keys.get_or_init(|| {
            let latch = self.primitive == "latch";
            let (count, seconds) = if latch {
                ("redsem_latch_waits_total", "redsem_latch_wait_seconds")
            } else {
                ("redsem_acquires_total", "redsem_acquire_seconds")
            };
            let by_outcome = |metric| {
                OUTCOMES.map(|o| self.key(metric, Some(("outcome", o.word(self.primitive)))))
            };
            Keys {
                acquires: by_outcome(count),
                acquire_seconds: by_outcome(seconds),
                queue_wait: self.key("redsem_queue_wait_seconds", None),
                hold: self.key("redsem_hold_seconds", None),
                renewals: ["ok", "not_held", "error"]
                    .map(|o| self.key("redsem_renewals_total", Some(("outcome", o)))),
                lost: self.key("redsem_leases_lost_total", None),
                released: self.key("redsem_permits_released_total", None),
                count_downs: self.key("redsem_latch_count_downs_total", None),
            }
        })
    }

    /// The per-tenant keys, for a handle whose requests name a tenant.
    fn tenant_keys(&self) -> Option<&TenantKeys> {
        let tenant = self.tenant.as_ref()?;
        Some(self.tenant_keys.get_or_init(|| {
            let key = |metric, outcome: Option<Outcome>| {
                let mut labels = self.labels.to_vec();
                labels.push(tenant.clone());
                if let Some(o) = outcome {
                    labels.push(Label::from_static_parts("outcome", o.word(self.primitive)));
                }
                Key::from_parts(metric, labels)
            };
            TenantKeys {
                acquires: OUTCOMES.map(|o| key("redsem_tenant_acquires_total", Some(o))),
                queue_wait: key("redsem_tenant_queue_wait_seconds", None),
            }
        }))
    }

    fn ended(&self, outcome: Outcome, took: Duration, queued: Option<Duration>) {
        let keys = self.keys();
        let i = outcome.index();
        if let Some(tenant) = self.tenant_keys() {
            metrics::with_recorder(|r| {
                r.register_counter(&tenant.acquires[i], &METADATA)
                    .increment(1);
                if let Some(queued) = queued {
                    r.register_histogram(&tenant.queue_wait, &METADATA)
                        .record(queued.as_secs_f64());
                }
            });
        }
        metrics::with_recorder(|r| {
            r.register_counter(&keys.acquires[i], &METADATA)
                .increment(1);
            r.register_histogram(&keys.acquire_seconds[i], &METADATA)
                .record(took.as_secs_f64());
            if let Some(queued) = queued {
                r.register_histogram(&keys.queue_wait, &METADATA)
                    .record(queued.as_secs_f64());
            }
        });
    }

    pub(crate) fn held(&self, held: Duration) {
        let key = &self.keys().hold;
        metrics::with_recorder(|r| {
            r.register_histogram(key, &METADATA)
                .record(held.as_secs_f64());
        });
    }

    pub(crate) fn renewal(&self, outcome: Renewal) {
        self.count(&self.keys().renewals[outcome as usize], 1);
    }

    pub(crate) fn lost(&self) {
        self.count(&self.keys().lost, 1);
    }

    pub(crate) fn released(&self, permits: u32) {
        self.count(&self.keys().released, u64::from(permits));
    }

    pub(crate) fn counted_down(&self) {
        self.count(&self.keys().count_downs, 1);
    }

    fn count(&self, key: &Key, by: u64) {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(by));
    }
}

/// One acquire (or latch wait) being measured: ended with [`Attempt::finish`]; dropped
/// unfinished (its future was cancelled), it counts as `cancelled`.
pub(crate) struct Attempt<'a> {
    meter: &'a Meter,
    started: Instant,
    /// When the request first queued.
    queued: OnceLock<Instant>,
    span: tracing::Span,
    finished: bool,
}

impl<'a> Attempt<'a> {
    pub(crate) fn start(meter: &'a Meter, span: tracing::Span, units: Option<u64>) -> Attempt<'a> {
        if let Some(units) = units {
            span.record("units", units);
        }
        Attempt {
            meter,
            started: Instant::now(),
            queued: OnceLock::new(),
            span,
            finished: false,
        }
    }

    /// The span the attempt's future runs in.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The request was queued (the first call counts).
    pub(crate) fn queued(&self) {
        let _ = self.queued.set(Instant::now());
    }

    pub(crate) fn finish<T>(mut self, result: &Result<T>) {
        self.finished = true;
        self.end(Outcome::of(result));
    }

    fn end(&self, outcome: Outcome) {
        let queued = match outcome {
            Outcome::Done => self.queued.get().map(|at| at.elapsed()),
            _ => None,
        };
        self.span
            .record("outcome", outcome.word(self.meter.primitive));
        self.meter.ended(outcome, self.started.elapsed(), queued);
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.end(Outcome::Cancelled);
        }
    }
}

/// The pub/sub connection came back after a loss.
pub(crate) fn pubsub_reconnected() {
    metrics::counter!("redsem_pubsub_reconnects_total").increment(1);
}

/// A script or function library was sent to Redis again because it did not have it (a
/// restart, a failover, `FUNCTION FLUSH`): called where `script/library.rs` loads the library.
pub(crate) fn script_reloaded() {
    metrics::counter!("redsem_script_reloads_total").increment(1);
}

/// How many clients of this process each engine serves: `[scripts, native]`.
static ENGINE_CLIENTS: std::sync::Mutex<[i64; 2]> = std::sync::Mutex::new([0, 0]);

/// `delta` clients more (or fewer) served by the module (`native`) or the scripts: sets the
/// `redsem_engine` gauge of both engines (absolute values, so that a recorder installed late
/// reads the right figures at the next change).
pub(crate) fn engine_clients(native: bool, delta: i64) {
    let mut counts = ENGINE_CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
    counts[usize::from(native)] += delta;
    for (engine, count) in ["scripts", "native"].into_iter().zip(*counts) {
        metrics::gauge!("redsem_engine", "engine" => engine).set(count as f64);
    }
}

/// A client found the module gone and went on with the scripts.
pub(crate) fn engine_fell_back() {
    metrics::counter!("redsem_engine_fallbacks_total").increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_names_share_one_label_value() {
        let only = MetricNames::only(["a"]);
        assert_eq!(&*only.label("a"), "a");
        assert_eq!(&*only.label("b"), HIDDEN_NAME);
        assert_eq!(&*MetricNames::Hidden.label("a"), HIDDEN_NAME);
        assert_eq!(&*MetricNames::Each.label("b"), "b");
    }

    #[test]
    fn tenants_past_the_bound_share_one_label_value() {
        let labels = TenantLabels::new(2);
        assert_eq!(&*labels.label("a"), "a");
        assert_eq!(&*labels.label("b"), "b");
        assert_eq!(&*labels.label("c"), OTHER_TENANTS);
        // The first ones keep theirs; a later one never gets a place.
        assert_eq!(&*labels.label("a"), "a");
        assert_eq!(&*labels.label("c"), OTHER_TENANTS);
        assert_eq!(labels.seen.lock().expect("lock").len(), 2);
    }

    #[test]
    fn a_meter_names_its_tenant_only_when_one_is_named() {
        let meter = Meter::new("lease", "llm", &MetricNames::Each);
        assert!(meter.tenant_keys().is_none());
        let acme = meter.again().with_tenant(Some("meter-test-acme"));
        let keys = acme.tenant_keys().expect("tenant keys");
        let labels: Vec<(&str, &str)> = keys.acquires[0]
            .labels()
            .map(|l| (l.key(), l.value()))
            .collect();
        assert!(
            labels.contains(&("tenant", "meter-test-acme")),
            "{labels:?}"
        );
        assert!(labels.contains(&("outcome", "granted")), "{labels:?}");
        assert!(acme.again().tenant_keys().is_some(), "kept by again()");
    }

    #[test]
    fn outcome_words_name_the_primitive_s_success() {
        assert_eq!(Outcome::Done.word("lease"), "granted");
        assert_eq!(Outcome::Done.word("latch"), "opened");
        assert_eq!(Outcome::Cancelled.word("permits"), "cancelled");
    }
}
