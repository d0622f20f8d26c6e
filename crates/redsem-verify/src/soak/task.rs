//! A client's task: its handles and identity, the recorder every task writes to, and what
//! the tasks share with the edge holds (the kit, the gate). The rounds are in `ops` (the
//! usual ones) and `edge` (holds that run to their lease end).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redsem::{CountDownLatch, LeaseSemaphore, PermitSemaphore};
use tokio::sync::watch;

use super::history::{LeaseOp, Record};
use super::look::{Auditor, Looker};
use redsem_verify::rng::Rng;

/// Where every client writes its records; times are microseconds since `start`.
#[derive(Debug)]
pub struct Recorder {
    pub start: Instant,
    pub records: Mutex<Vec<Record>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            records: Mutex::new(Vec::new()),
        }
    }

    pub fn now(&self) -> u64 {
        self.at(Instant::now())
    }

    pub fn at(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.start).as_micros()).unwrap_or(u64::MAX)
    }

    pub fn push(&self, record: Record) {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(record);
    }

    /// Change the run's `meta` record (the first), after the fact.
    pub fn with_meta(&self, change: impl FnOnce(&mut super::history::Meta)) {
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Record::Meta(meta)) = records.iter_mut().find(|r| matches!(r, Record::Meta(_)))
        {
            change(meta);
        }
    }
}

/// One task's handles and identity.
pub struct Task {
    pub client: u32,
    pub task: u32,
    pub rec: Arc<Recorder>,
    pub leases: Vec<LeaseSemaphore>,
    /// Each permit semaphore with the permits it was set to.
    pub permits: Vec<(PermitSemaphore, u32)>,
    /// Latches by epoch: the task moves to the next one once it saw the current one open.
    pub latch: Box<dyn Fn(u64) -> Option<CountDownLatch> + Send + Sync>,
    /// The latches set so far (by [`latch_setter`], once each: setting an opened latch again
    /// would start it over), and the furthest epoch a task has reached.
    pub latches_set: Arc<AtomicU64>,
    pub latch_reached: Arc<AtomicU64>,
    pub stop: watch::Receiver<bool>,
    pub rng: Rng,
    /// Weights of lease, permit and latch rounds.
    pub weights: [u32; 3],
    /// A limit for the permit waits that have none (`acquire`): where permits can be lost
    /// for good (a failover), a wait without one could block the task to the end.
    pub permit_wait_limit: Option<Duration>,
    /// The holds that run to their lease end (`super::edge`); `None`: none (`--no-edges`).
    pub edge: Option<EdgeKit>,
    /// Whether calls are cancelled at random points (off with `--no-cancels`).
    pub cancels: bool,
    /// Looks at the server after a cancelled lease call (`None`: behind Sentinels).
    pub looker: Option<Looker>,
}

/// When each check-in of a wait answered "queued" (the first is when the request was
/// queued), gathered by the progress callback and written into the operation.
#[derive(Clone)]
pub struct Progress {
    reports: Arc<Mutex<Vec<u64>>>,
    rec: Arc<Recorder>,
}

impl Progress {
    pub fn new(rec: &Arc<Recorder>) -> Progress {
        Progress {
            reports: Arc::new(Mutex::new(Vec::new())),
            rec: Arc::clone(rec),
        }
    }

    /// The callback for `acquire_with_progress`.
    pub fn reporter(&self) -> impl FnMut(u64) + Send + 'static {
        let this = self.clone();
        move |_ahead: u64| {
            this.reports
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(this.rec.now());
        }
    }

    /// `queued_us` and `max_gap_us` of `op` (its `inv_us` and `ret_us` set).
    pub fn finish(&self, op: &mut LeaseOp) {
        let reports = std::mem::take(
            &mut *self
                .reports
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        op.queued_us = reports.first().copied();
        if !reports.is_empty() {
            let mut times = vec![op.inv_us];
            times.extend(&reports);
            times.push(op.ret_us);
            op.max_gap_us = times.windows(2).map(|w| w[1].saturating_sub(w[0])).max();
        }
    }
}

pub fn outcome(err: &redsem::Error) -> String {
    if err.is_not_acquired() {
        "busy".into()
    } else if err.is_timeout() {
        "timeout".into()
    } else {
        // The whole chain: "redis error" alone does not tell a LOADING from a refusal.
        let mut text = format!("error: {err}");
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }
}

/// The lease of an edge hold: short, so a hold reaches its end soon and frees the semaphore.
pub const EDGE_LEASE: Duration = Duration::from_millis(200);

/// What a task needs for edge holds.
pub struct EdgeKit {
    pub gate: std::sync::Arc<EdgeGate>,
    /// Per lease semaphore (in the order of `Task::leases`), handles with the edge lease:
    /// without keep-alive, and with it.
    pub leases: Vec<[LeaseSemaphore; 2]>,
    /// The same semaphores on a client that reaches the server directly (no proxy): the
    /// probes.
    pub probes: Vec<LeaseSemaphore>,
    /// Reads the server's side of a grant (`None` where the soak has no direct address of
    /// the server that takes writes: behind Sentinels).
    pub auditor: Option<Auditor>,
}

/// One edge hold at a time, with a pause between; and the `stall` hold the nemesis may aim a
/// `lease_end` fault at.
#[derive(Debug)]
pub struct EdgeGate {
    state: Mutex<GateState>,
    /// The pause after an edge hold: from `gap_ms.0` to `gap_ms.1`.
    gap_ms: (u64, u64),
}

#[derive(Debug)]
struct GateState {
    busy: bool,
    next_at: Instant,
    /// A `stall` hold in progress: its client, and whether the nemesis took it already.
    stall: Option<(u32, bool)>,
    turns: u64,
}

impl EdgeGate {
    pub fn new(gap_ms: (u64, u64)) -> EdgeGate {
        EdgeGate {
            state: Mutex::new(GateState {
                busy: false,
                next_at: Instant::now(),
                stall: None,
                turns: 0,
            }),
            gap_ms,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the caller may start an edge hold now (then it must call [`finish`]).
    ///
    /// [`finish`]: EdgeGate::finish
    pub fn try_start(&self) -> bool {
        let mut state = self.state();
        if state.busy || Instant::now() < state.next_at {
            return false;
        }
        state.busy = true;
        true
    }

    /// The edge hold ended: the next may start after a pause (spread by the turn count, so
    /// the schedule depends on no task's generator).
    pub fn finish(&self) {
        let mut state = self.state();
        state.turns += 1;
        let (lo, hi) = self.gap_ms;
        let spread = (state.turns.wrapping_mul(0x9e37_79b9) >> 7) % (hi - lo).max(1);
        state.busy = false;
        state.stall = None;
        state.next_at = Instant::now() + Duration::from_millis(lo + spread);
    }

    pub fn post_stall(&self, client: u32) {
        self.state().stall = Some((client, false));
    }

    /// For the nemesis: the client of a `stall` hold not aimed at yet (now taken).
    pub fn take_stall(&self) -> Option<u32> {
        let mut state = self.state();
        match state.stall {
            Some((client, false)) => {
                state.stall = Some((client, true));
                Some(client)
            }
            _ => None,
        }
    }
}
