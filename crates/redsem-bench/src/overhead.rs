//! `--recorder`: what redsem's metrics cost on the uncontended cycle (S1), without and with a
//! recorder in the same run.
//!
//! A recorder cannot be uninstalled, so one is installed for the whole run that either
//! forwards to a real Prometheus recorder (`metrics-exporter-prometheus`, its registry and
//! histograms, no HTTP listener) or answers with the no-op handles the facade's own no-op
//! recorder gives when none is installed: the call path up to the recorder is the same in
//! both. S1 then runs in slices that alternate the two, so both see the same machine (the
//! VM changes speed for seconds at a time).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use redsem::LeaseOptions;
use serde::Serialize;

use crate::BenchResult;
use crate::ctx::Ctx;
use crate::sem::BenchSem;
use crate::stats::Latency;

/// Length of one slice.
const SLICE: Duration = Duration::from_millis(250);

/// Forwards to `inner` while `on`; the no-op handles otherwise.
struct Switch {
    on: Arc<AtomicBool>,
    inner: PrometheusRecorder,
}

impl Recorder for Switch {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

/// S1 without and with a recorder, timed in alternating slices.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RecorderOverhead {
    /// try_acquire + release with the no-op handles (as with no recorder installed).
    pub(crate) without: Latency,
    /// The same with the Prometheus recorder recording every metric.
    pub(crate) with: Latency,
    /// `with.p50_us / without.p50_us - 1`, in percent.
    pub(crate) p50_overhead_pct: f64,
    /// `with.mean_us / without.mean_us - 1`, in percent.
    pub(crate) mean_overhead_pct: f64,
    /// Lines of the Prometheus text the recorder held at the end (it did record).
    pub(crate) exposition_lines: usize,
}

/// Install the switch recorder (off). Call before anything reports a metric.
pub(crate) fn install() -> BenchResult<(Arc<AtomicBool>, PrometheusHandle)> {
    let on = Arc::new(AtomicBool::new(false));
    let inner = PrometheusBuilder::new().build_recorder();
    let handle = inner.handle();
    metrics::set_global_recorder(Switch {
        on: on.clone(),
        inner,
    })
    .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    redsem::describe_metrics();
    Ok((on, handle))
}

/// S1 on a capacity-5 semaphore for `time` in each mode.
pub(crate) async fn run(
    ctx: &Ctx,
    time: Duration,
    on: &AtomicBool,
    handle: &PrometheusHandle,
) -> BenchResult<RecorderOverhead> {
    let prefix = ctx.prefix("rec");
    let sems = ctx
        .redsem_sems(&prefix, "s1-recorder", 5, LeaseOptions::default(), 1)
        .await?;
    let sem = &sems[0];
    for _ in 0..20 {
        cycle(sem).await?;
    }
    let len = SLICE.min(time);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut elapsed = Duration::ZERO;
    while elapsed < time {
        let start = Instant::now();
        on.store(false, Ordering::Relaxed);
        slice(sem, len, &mut without).await?;
        on.store(true, Ordering::Relaxed);
        slice(sem, len, &mut with).await?;
        on.store(false, Ordering::Relaxed);
        elapsed += start.elapsed() / 2;
    }
    ctx.clean(&prefix).await?;
    let (without, with) = (Latency::of(&without), Latency::of(&with));
    let pct = |a: f64, b: f64| (a / b.max(1e-9) - 1.0) * 100.0;
    Ok(RecorderOverhead {
        p50_overhead_pct: pct(with.p50_us, without.p50_us),
        mean_overhead_pct: pct(with.mean_us, without.mean_us),
        without,
        with,
        exposition_lines: handle.render().lines().count(),
    })
}

pub(crate) async fn slice<S: BenchSem>(
    sem: &S,
    len: Duration,
    sample: &mut Vec<Duration>,
) -> BenchResult<()> {
    let start = Instant::now();
    while start.elapsed() < len {
        let t = Instant::now();
        cycle(sem).await?;
        sample.push(t.elapsed());
    }
    Ok(())
}

/// One try_acquire + release of a free unit.
pub(crate) async fn cycle<S: BenchSem>(sem: &S) -> BenchResult<()> {
    let permit = sem
        .try_acquire()
        .await?
        .ok_or("an uncontended try_acquire found no free unit")?;
    sem.release(permit).await
}
