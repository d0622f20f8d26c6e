//! The clients' tasks: random operations on a few names, each recorded.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redsem::{CountDownLatch, LeasePermit, PermitSemaphore};
use tokio::sync::watch;

use super::history::{LOOK_AFTER_MS, LatchOp, LeaseOp, Look, PermitOp, Record};
use super::task::{Progress, Recorder, Task, outcome};

/// Whether `err` is the server's `LOADING` refusal (it ran nothing).
fn loading(err: &redsem::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(redis_err) = cause.downcast_ref::<redis::RedisError>() {
            return redis_err.kind()
                == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading);
        }
        source = cause.source();
    }
    false
}

/// Where [`cut_short`] cancels a call.
#[derive(Debug, Clone, Copy)]
pub enum CancelPoint {
    /// After the call was polled once and the runtime turned over this many times.
    Polls(u32),
    /// After this long.
    After(Duration),
}

impl std::fmt::Display for CancelPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CancelPoint::Polls(n) => write!(f, "poll {n}"),
            CancelPoint::After(after) => write!(f, "after {} us", after.as_micros()),
        }
    }
}

/// Run `call` until `point`, then drop it (cancel it) if it has not answered: `None`.
pub async fn cut_short<F: Future>(point: CancelPoint, call: F) -> Option<F::Output> {
    let cancel = async move {
        match point {
            CancelPoint::Polls(n) => {
                for _ in 0..n {
                    tokio::task::yield_now().await;
                }
            }
            CancelPoint::After(after) => tokio::time::sleep(after).await,
        }
    };
    tokio::select! {
        biased;
        answer = call => Some(answer),
        () = cancel => None,
    }
}

/// How long a permit wait without a limit may last before the task gives it up (drops it, as
/// `cancel` does): a permit lost for good would otherwise block the task to the end.
const PERMIT_WAIT_GUARD: Duration = Duration::from_secs(10);

impl Task {
    pub async fn run(mut self) {
        let mut epoch = 0;
        while !*self.stop.borrow() {
            let total: u32 = self.weights.iter().sum();
            let pick = self.rng.below(u64::from(total)) as u32;
            if pick < self.weights[0] {
                self.lease_round().await;
            } else if pick < self.weights[0] + self.weights[1] {
                self.permit_round().await;
            } else {
                self.latch_round(&mut epoch).await;
            }
        }
    }

    /// The end of `permit`'s local validity, if it has not passed. `expires_at()` is clamped
    /// to the present once the validity has ended, so read after a stall (a frozen runtime)
    /// it would stretch the believed holding past its real end: only an instant still ahead
    /// is the validity itself. The validity only moves forward (renewals), so the latest
    /// such sample is a lower bound of the end the holder believed.
    pub fn validity(&self, permit: &LeasePermit) -> Option<u64> {
        let end = permit.expires_at().into_std();
        (end > Instant::now()).then(|| self.rec.at(end))
    }

    pub async fn stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
    }

    /// Whether to cancel the next call that gives something back (`chance` of the time).
    fn cancel_this(&mut self, chance: f64) -> bool {
        self.cancels && self.rng.chance(chance)
    }

    /// Where a call is cancelled: a third right after its first poll (it has queued its
    /// request, which may not be sent yet), a third after 1–8 more polls (the runtime's other
    /// tasks, the connection's and the batcher's among them, ran in between: the request in
    /// flight, or its reply just in), a third after 0–3 ms of the timer (tokio's counts whole
    /// milliseconds: after the reply, or in flight when the server is slow).
    fn cancel_point(&mut self) -> CancelPoint {
        match self.rng.below(3) {
            0 => CancelPoint::Polls(0),
            1 => CancelPoint::Polls(1 + self.rng.below(8) as u32),
            _ => CancelPoint::After(Duration::from_micros(self.rng.below(3000))),
        }
    }

    /// What the server lists for lease semaphore `name` now (ids leased, ids queued).
    async fn listed(&self, name: &str) -> Option<(Vec<String>, Vec<String>)> {
        let looker = self.looker.as_ref()?;
        let (_, leased, queued) = looker.lock().await.list(name).await?;
        Some((leased, queued))
    }

    /// Look at what the server lists for `name` [`LOOK_AFTER_MS`] after a call was cancelled
    /// (in a task of its own: the round goes on), and record it.
    fn look_later(
        &self,
        name: &str,
        (after, point): (&str, CancelPoint),
        id: Option<String>,
        times: (u64, u64),
        before: Vec<String>,
    ) {
        let Some(looker) = self.looker.clone() else {
            return;
        };
        let mut look = Look {
            client: self.client,
            task: self.task,
            name: name.to_owned(),
            after: after.to_owned(),
            id,
            inv_us: times.0,
            cancel_us: times.1,
            point: point.to_string(),
            before,
            ..Look::default()
        };
        let rec = Arc::clone(&self.rec);
        drop(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(LOOK_AFTER_MS)).await;
            let mut auditor = looker.lock().await;
            look.t0_us = rec.now();
            let Some((_, leased, queued)) = auditor.list(&look.name).await else {
                return;
            };
            look.t1_us = rec.now() + 1;
            look.leased = leased;
            look.queued = queued;
            rec.push(Record::Look(look));
        }));
    }

    async fn lease_round(&mut self) {
        if self.edge.as_ref().is_some_and(|e| e.gate.try_start()) {
            self.edge_round().await;
            return;
        }
        let sem = self.leases[self.rng.below(self.leases.len() as u64) as usize].clone();
        let cap = sem.capacity();
        let units = if cap > 1 && self.rng.chance(0.15) {
            2
        } else {
            1
        };
        let kind = self.rng.below(100);
        let mut op = LeaseOp {
            client: self.client,
            task: self.task,
            name: sem.name().to_owned(),
            tenant: sem.options().tenant.as_ref().map(|t| t.name().to_owned()),
            units,
            ..LeaseOp::default()
        };
        if kind < 5 {
            op.op = "status".into();
            op.inv_us = self.rec.now();
            let r = sem.status().await;
            op.ret_us = self.rec.now();
            match r {
                Ok(status) => {
                    op.outcome = "ok".into();
                    op.in_use = Some(status.in_use);
                }
                Err(e) => op.outcome = outcome(&e),
            }
            self.rec.push(Record::Lease(op));
            return;
        }
        let watch = Progress::new(&self.rec);
        let progress = watch.reporter();
        op.inv_us = self.rec.now();
        let result: Result<LeasePermit, String> = if kind < 30 {
            op.op = "try".into();
            let r = if units == 1 {
                sem.try_acquire().await
            } else {
                sem.try_acquire_many(units).await
            };
            r.map_err(|e| outcome(&e))
        } else if kind < 50 {
            op.op = "timeout".into();
            let wait = Duration::from_millis(20 + self.rng.below(300));
            sem.acquire_with_progress(units, Some(wait), progress)
                .await
                .map_err(|e| outcome(&e))
        } else if kind < 62 {
            op.op = "cancel".into();
            // Half the cancels land within the first 3 ms (before the send, in
            // flight, after the reply), a third of those on a `try_acquire`; the server is
            // looked at before the call and a while after the cancel.
            let point = self.cancels && self.rng.chance(0.5);
            let fast = point && self.rng.chance(0.33);
            let after = if point {
                self.cancel_point()
            } else {
                CancelPoint::After(Duration::from_millis(5 + self.rng.below(100)))
            };
            let before = if self.cancels {
                self.listed(&op.name).await
            } else {
                None
            };
            op.inv_us = self.rec.now();
            let r = if fast {
                let call = async {
                    if units == 1 {
                        sem.try_acquire().await
                    } else {
                        sem.try_acquire_many(units).await
                    }
                };
                cut_short(after, call).await
            } else {
                cut_short(after, sem.acquire_with_progress(units, None, progress)).await
            };
            match r {
                Some(r) => r.map_err(|e| outcome(&e)),
                None => {
                    if let Some((leased, queued)) = before {
                        let mut before = leased;
                        before.extend(queued);
                        let times = (op.inv_us, self.rec.now());
                        self.look_later(&op.name, ("acquire", after), None, times, before);
                    }
                    Err("cancelled".into())
                }
            }
        } else {
            op.op = if units == 1 {
                "acquire"
            } else {
                "acquire_many"
            }
            .into();
            tokio::select! {
                r = sem.acquire_with_progress(units, None, progress) => r.map_err(|e| outcome(&e)),
                () = self.stopped() => Err("stopped".into()),
            }
        };
        op.ret_us = self.rec.now();
        watch.finish(&mut op);
        let permit = match result {
            Ok(permit) => permit,
            Err(outcome) => {
                op.outcome = outcome;
                self.rec.push(Record::Lease(op));
                return;
            }
        };
        op.outcome = "ok".into();
        op.token = Some(permit.token().get());
        op.id = Some(permit.id().as_str().to_owned());
        op.slots = permit.slots().to_vec();
        // The local validity, sampled while it lasts (see `validity`); a grant whose validity
        // ended before it was first seen (its runtime frozen while the reply came) was never
        // believed held: its interval is empty.
        let mut valid_until = self.validity(&permit).unwrap_or(op.ret_us);
        if self.rng.below(100) < 10 {
            // What the server stored beside what the holder believes (the `lease_end` rule).
            let believed = self.validity(&permit);
            self.audit(&mut op, permit.id(), believed).await;
        }
        let hold = Duration::from_micros(self.rng.below(8000));
        tokio::select! {
            () = tokio::time::sleep(hold) => {}
            () = permit.lost() => op.lost_us = Some(self.rec.now()),
        }
        if let Some(v) = self.validity(&permit) {
            valid_until = valid_until.max(v);
        }
        if op.lost_us.is_none() && self.rng.below(100) < 10 {
            // lost() is watched during the refresh too: it may fire while the call waits.
            tokio::select! {
                biased;
                () = permit.lost() => {
                    op.lost_us = Some(self.rec.now());
                    op.refresh = Some("abandoned: lost".into());
                }
                r = permit.refresh() => {
                    op.refresh = Some(match r {
                        Ok(()) => "ok".into(),
                        Err(e) => outcome(&e),
                    });
                }
            }
        }
        if let Some(v) = self.validity(&permit) {
            valid_until = valid_until.max(v);
        }
        if op.lost_us.is_none() && !permit.is_held() {
            op.lost_us = Some(self.rec.now());
        }
        op.valid_until_us = Some(valid_until);
        let drop_it = self.rng.below(100) < 10;
        self.end_hold(&mut op, permit, drop_it).await;
        self.rec.push(Record::Lease(op));
    }

    /// End a hold: drop the permit, or release it and record the release. A release is
    /// cancelled at a random point now and then, and the server looked at a
    /// while later: the unit must not be listed as held any more.
    pub async fn end_hold(&mut self, op: &mut LeaseOp, permit: LeasePermit, drop_it: bool) {
        op.end_us = Some(self.rec.now());
        if drop_it {
            op.end = Some("drop".into());
            drop(permit);
            return;
        }
        op.end = Some("release".into());
        let id = permit.id().as_str().to_owned();
        let mut point = CancelPoint::Polls(0);
        let r = if self.cancel_this(0.3) {
            point = self.cancel_point();
            cut_short(point, permit.release()).await
        } else {
            Some(permit.release().await)
        };
        op.release_ret_us = Some(self.rec.now());
        op.release_outcome = Some(match r {
            Some(Ok(())) => "ok".into(),
            Some(Err(e)) if e.is_not_held() => "not_held".into(),
            Some(Err(e)) => outcome(&e),
            None => {
                let times = (op.end_us.unwrap_or(0), self.rec.now());
                self.look_later(&op.name, ("release", point), Some(id), times, Vec::new());
                "cancelled".into()
            }
        });
    }

    async fn permit_round(&mut self) {
        let (sem, initial) =
            self.permits[self.rng.below(self.permits.len() as u64) as usize].clone();
        let kind = self.rng.below(100);
        let mut n = 1 + self.rng.below(2);
        if kind >= 70 {
            // A wait without a limit asks for no more than there are: a request for more
            // would head the queue until an `add` came along, and block every other task.
            n = n.min(u64::from(initial.max(1)));
        }
        let mut op = PermitOp {
            client: self.client,
            task: self.task,
            name: sem.name().to_owned(),
            n: i64::try_from(n).unwrap_or(1),
            ..PermitOp::default()
        };
        let n32 = u32::try_from(n).unwrap_or(1);
        if kind < 6 {
            // Add a permit, hold the addition a moment, take it away again.
            for delta in [1i64, -1] {
                let mut add = op.clone();
                add.op = "add".into();
                add.n = delta;
                add.inv_us = self.rec.now();
                let r = sem.add_permits(delta).await;
                add.ret_us = self.rec.now();
                // `NotReplicated`: the primary added it; take it away as after a success.
                let added = r
                    .as_ref()
                    .map_or_else(redsem::Error::is_not_replicated, |()| true);
                add.outcome = match r {
                    Ok(()) => "ok".into(),
                    Err(e) => outcome(&e),
                };
                self.rec.push(Record::Permit(add));
                tokio::time::sleep(Duration::from_micros(self.rng.below(5000))).await;
                if !added {
                    // Taking away a permit whose addition failed would leave one fewer for
                    // good (the second long run's `q` ended at -2 that way).
                    break;
                }
            }
            return;
        }
        op.inv_us = self.rec.now();
        let result: Result<i64, String> = if kind < 14 {
            op.op = "drain".into();
            sem.drain_permits()
                .await
                .map(|d| i64::try_from(d).unwrap_or(i64::MAX))
                .map_err(|e| outcome(&e))
        } else if kind < 40 {
            op.op = "try".into();
            sem.try_acquire(n32)
                .await
                .map(|()| op.n)
                .map_err(|e| outcome(&e))
        } else if kind < 60 {
            op.op = "timeout".into();
            let wait = Duration::from_millis(20 + self.rng.below(300));
            sem.acquire_timeout(n32, wait)
                .await
                .map(|()| op.n)
                .map_err(|e| outcome(&e))
        } else if kind < 70 {
            op.op = "cancel".into();
            // Half the cancels land within the first 3 ms.
            let after = if self.cancel_this(0.5) {
                self.cancel_point()
            } else {
                CancelPoint::After(Duration::from_millis(5 + self.rng.below(100)))
            };
            match cut_short(after, sem.acquire(n32)).await {
                Some(r) => r.map(|()| op.n).map_err(|e| outcome(&e)),
                None => Err("cancelled".into()),
            }
        } else if let Some(limit) = self.permit_wait_limit {
            op.op = "timeout".into();
            tokio::select! {
                r = sem.acquire_timeout(n32, limit) => r.map(|()| op.n).map_err(|e| outcome(&e)),
                () = self.stopped() => Err("stopped".into()),
            }
        } else {
            op.op = "acquire".into();
            tokio::select! {
                r = sem.acquire(n32) => r.map(|()| op.n).map_err(|e| outcome(&e)),
                () = self.stopped() => Err("stopped".into()),
                () = tokio::time::sleep(PERMIT_WAIT_GUARD) => Err("cancelled".into()),
            }
        };
        op.ret_us = self.rec.now();
        let taken = match result {
            Ok(taken) => taken,
            Err(outcome) => {
                op.outcome = outcome;
                self.rec.push(Record::Permit(op));
                return;
            }
        };
        op.outcome = "ok".into();
        op.n = taken;
        let mut failed_release = false;
        if taken > 0 {
            tokio::time::sleep(Duration::from_micros(self.rng.below(8000))).await;
            op.release_inv_us = Some(self.rec.now());
            let release = sem.release(u32::try_from(taken).unwrap_or(u32::MAX));
            // A release cancelled at a random point must still give its permits
            // back (the ledger counts it given back); it is not made up.
            let r = if self.cancel_this(0.3) {
                let after = self.cancel_point();
                cut_short(after, release).await
            } else {
                Some(release.await)
            };
            op.release_ret_us = Some(self.rec.now());
            // `NotReplicated`: applied on the primary; lost only if a failover follows.
            failed_release = matches!(&r, Some(Err(e)) if !e.is_not_replicated());
            op.release_outcome = Some(match r {
                Some(Ok(())) => "ok".into(),
                Some(Err(e)) => outcome(&e),
                None => "cancelled".into(),
            });
        }
        let (name, client, task) = (op.name.clone(), op.client, op.task);
        self.rec.push(Record::Permit(op));
        if failed_release {
            self.make_up(&sem, &name, client, task, taken).await;
        }
    }

    /// Give back `n` permits whose release failed, with `add_permits`, as an operator would:
    /// a failed release cannot be resent safely (a new call has a new id, and the first may
    /// have been applied), and a permit semaphore has no lease to end what it kept. Recorded
    /// as an `add`, so the ledger counts it (if the release was applied after all, the
    /// semaphore has `n` more permits, which the ledger allows). Tried once more only after
    /// an error that says the server did not run it (`LOADING`): resending an addition that
    /// may have been applied would add again (a Sentinel run so ended with 36 permits of 3).
    async fn make_up(&self, sem: &PermitSemaphore, name: &str, client: u32, task: u32, n: i64) {
        for _ in 0..20 {
            let mut add = PermitOp {
                client,
                task,
                name: name.to_owned(),
                op: "add".into(),
                n,
                ..PermitOp::default()
            };
            add.inv_us = self.rec.now();
            let r = sem.add_permits(n).await;
            add.ret_us = self.rec.now();
            add.outcome = match &r {
                Ok(()) => "ok".into(),
                Err(e) => outcome(e),
            };
            self.rec.push(Record::Permit(add));
            let not_run = matches!(&r, Err(e) if loading(e));
            if !not_run || *self.stop.borrow() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn latch_round(&mut self, epoch: &mut u64) {
        if *epoch >= self.latches_set.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            return;
        }
        let Some(latch) = (self.latch)(*epoch) else {
            return;
        };
        let mut op = LatchOp {
            client: self.client,
            task: self.task,
            name: latch.name().to_owned(),
            ..LatchOp::default()
        };
        let kind = self.rng.below(100);
        op.inv_us = self.rec.now();
        let mut open = false;
        if kind < 50 {
            op.op = "count_down".into();
            // Now and then cancelled at a random point; once called, a count-down
            // happens (the latch rule holds it to that).
            let r = if self.cancel_this(0.3) {
                let after = self.cancel_point();
                cut_short(after, latch.count_down()).await
            } else {
                Some(latch.count_down().await)
            };
            op.outcome = match r {
                Some(Ok(left)) => {
                    // What it left is a read of the count, held to the history as one.
                    op.count = left;
                    open = left == Some(0);
                    "ok".into()
                }
                Some(Err(e)) => outcome(&e),
                None => "cancelled".into(),
            };
        } else if kind < 75 {
            op.op = "count".into();
            match latch.count().await {
                Ok(c) => {
                    op.outcome = "ok".into();
                    op.count = Some(c);
                    open = c == 0;
                }
                Err(e) => op.outcome = outcome(&e),
            }
        } else {
            op.op = "wait".into();
            let wait = Duration::from_millis(200 + self.rng.below(800));
            match latch.wait_timeout(wait).await {
                Ok(()) => {
                    op.outcome = "ok".into();
                    open = true;
                }
                Err(e) => op.outcome = outcome(&e),
            }
        }
        op.ret_us = self.rec.now();
        self.rec.push(Record::Latch(op));
        if open {
            *epoch += 1;
            self.latch_reached.fetch_max(*epoch, Ordering::SeqCst);
        }
    }
}

/// Set each latch once, a few epochs ahead of the furthest task, until `stop`.
pub async fn latch_setter(
    latch: impl Fn(u64) -> Option<CountDownLatch>,
    count: u64,
    rec: Arc<Recorder>,
    set: Arc<AtomicU64>,
    reached: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let next = set.load(Ordering::SeqCst);
        if next > reached.load(Ordering::SeqCst) + 3 {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            continue;
        }
        let Some(l) = latch(next) else { return };
        let mut op = LatchOp {
            name: l.name().to_owned(),
            op: "set".into(),
            client: u32::MAX,
            ..LatchOp::default()
        };
        op.inv_us = rec.now();
        let r = l.try_set_count(count).await;
        op.ret_us = rec.now();
        op.outcome = match &r {
            Ok(true) => "ok".into(),
            Ok(false) => "already".into(),
            Err(e) => outcome(e),
        };
        rec.push(Record::Latch(op));
        match r {
            Ok(_) => set.store(next + 1, Ordering::SeqCst),
            Err(_) => {
                if *stop.borrow() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
