//! The keepalive of a `Redsem`: one driver task renews every permit that asks for it and
//! declares any permit lost once its lease may have ended unrenewed.
//!
//! Each scheduled permit has one timer in an ordered set keyed by the [`clock`] instant of its
//! next event: its next renewal (every third of the lease; 50 ms after a failed one) or, for a
//! permit that is not renewed or whose renewal is in flight, the end of its local validity. The
//! driver sleeps until the first timer, pops every timer that is due, and starts the due
//! renewals as futures of one `FuturesUnordered`: they go out together on the multiplexed
//! connection, and a slow or hanging renewal delays no other permit.
//!
//! Deadlines are kept on [`clock`] time, which counts time the machine spent suspended;
//! tokio's timers do not, so the driver never sleeps longer than a quarter of the shortest
//! scheduled lease before it reads the clock again.
//!
//! The driver starts with the first permit and stops when its `Redsem` closes (or when its
//! runtime goes, after which the next permit starts another). It holds no handle to the
//! `Redsem`: only the scheduled permits do, and a permit leaves the schedule when it is
//! released, dropped, forgotten or lost.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use futures_util::future::BoxFuture;

use crate::clock;
use crate::error::Result;
/// After a failed renewal (Redis unreachable), try again this often, within the lease: as
/// often as a waiter checks in through a connection loss.
use crate::retry::RETRY_EVERY as RETRY_AFTER_ERROR;
use crate::types::PermitId;

/// What the keepalive needs of a permit it schedules (a lease permit's shared state, in
/// `lease/permit.rs`): the keepalive sits under the primitives and names none of them.
pub(crate) trait Renewable: Send + Sync {
    /// Its key in the schedule ([`Keepalive::ticket`]).
    fn ticket(&self) -> u64;
    /// Its lease: renewed every third of it.
    fn lease(&self) -> Duration;
    /// Its lease can have ended on the server no earlier than this ([`clock`] time).
    fn valid_until(&self) -> Duration;
    /// The semaphore's name, for the log.
    fn semaphore(&self) -> &str;
    /// The permit's id, for the log.
    fn id(&self) -> &PermitId;
    /// Report it lost, saying `why`.
    fn lose(&self, why: &str);
    /// Resolves when it is lost, released or dropped.
    fn gone(&self) -> BoxFuture<'_, ()>;
    /// Send one renewal: when it was sent if Redis renewed it, `None` if Redis no longer
    /// holds it.
    fn refresh(&self) -> BoxFuture<'_, Result<Option<Duration>>>;
}

/// The keepalive of one `Redsem` (kept in its `Shared`).
pub(crate) struct Keepalive {
    inner: Arc<Inner>,
    /// Cancelled when the `Redsem` closes: stops the driver.
    closed: CancellationToken,
    /// Numbers the permits: their key in the schedule.
    tickets: AtomicU64,
}

struct Inner {
    schedule: Mutex<Schedule>,
    /// Wakes the driver when a new timer comes before the one it sleeps for.
    wake: Notify,
}

#[derive(Default)]
struct Schedule {
    /// (instant of the next event, ticket), first due first.
    timers: BTreeSet<(Duration, u64)>,
    permits: HashMap<u64, Entry>,
    /// The leases of the scheduled permits, with how many have each: the driver re-reads the
    /// clock at least every quarter of the shortest.
    leases: BTreeMap<Duration, usize>,
    /// A driver task is running (or spawned and not yet polled).
    running: bool,
    /// When the driver wakes by itself (`None`: only when woken): a new timer that comes
    /// later needs no wake-up.
    wakes_at: Option<Duration>,
}

struct Entry {
    state: Arc<dyn Renewable>,
    /// Its key in `timers`.
    at: Duration,
    /// When the next renewal is due; `None` if the permit is not renewed.
    next: Option<Duration>,
    /// A renewal was sent and has not answered.
    in_flight: bool,
    /// The primary moved while a renewal was in flight: renew again as soon as it answers.
    again: bool,
}

impl Entry {
    /// The instant of the entry's next event: the renewal when one is due before the local
    /// validity ends and none is in flight, else the end of the validity.
    fn event_at(&self) -> Duration {
        let valid_until = self.state.valid_until();
        match self.next {
            Some(next) if !self.in_flight => next.min(valid_until),
            _ => valid_until,
        }
    }

    fn period(&self) -> Duration {
        self.state.lease() / 3
    }
}

/// What a renewal came back with: `None` if it was cancelled (the permit was lost, released
/// or dropped).
type Renewed = (u64, Option<Result<bool>>);

fn lock(schedule: &Mutex<Schedule>) -> MutexGuard<'_, Schedule> {
    // Every update below leaves the maps consistent at each step that could panic.
    schedule
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Keepalive {
    pub(crate) fn new(closed: CancellationToken) -> Keepalive {
        Keepalive {
            inner: Arc::new(Inner {
                schedule: Mutex::new(Schedule::default()),
                wake: Notify::new(),
            }),
            closed,
            tickets: AtomicU64::new(0),
        }
    }

    /// A new permit's key in the schedule.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// Schedule a new permit: its first renewal (if `renew`) after a third of the lease, or
    /// sooner if less than two thirds are left (a grant handed over with a wake-up runs on the
    /// waiter's lease), and its loss when its local validity ends. Starts the driver if none
    /// runs.
    pub(crate) fn schedule(&self, state: Arc<dyn Renewable>, renew: bool) {
        let now = clock::now();
        let period = state.lease() / 3;
        let next = renew.then(|| now + period.min(state.valid_until().saturating_sub(now) / 2));
        let ticket = state.ticket();
        let lease = state.lease();
        let mut entry = Entry {
            state,
            at: Duration::ZERO,
            next,
            in_flight: false,
            again: false,
        };
        entry.at = entry.event_at();
        let at = entry.at;
        let start = {
            let mut schedule = lock(&self.inner.schedule);
            schedule.insert(ticket, entry, lease);
            let first = schedule.timers.first().is_some_and(|&(_, t)| t == ticket);
            if schedule.running {
                // The driver sleeps past this timer only if it wakes by itself later: an
                // uncontended loop of acquire and release then wakes it about once per quarter
                // of a lease, not once per permit.
                if first && schedule.wakes_at.is_none_or(|wakes| at < wakes) {
                    self.inner.wake.notify_one();
                }
                false
            } else {
                schedule.running = true;
                true
            }
        };
        if start {
            self.start_driver();
        }
    }

    /// Take a permit out of the schedule (released, dropped, forgotten or lost): no renewal
    /// of it starts after this returns, and the answer of one in flight is ignored.
    pub(crate) fn unschedule(&self, ticket: u64) {
        // Dropped outside the lock: the last handle of a permit may go with it.
        let entry = lock(&self.inner.schedule).remove(ticket);
        drop(entry);
    }

    /// A manual refresh sent at `sent` succeeded: the next renewal is due a third of the lease
    /// after it, and the loss timer follows the moved validity.
    pub(crate) fn refreshed(&self, ticket: u64, sent: Duration) {
        let mut schedule = lock(&self.inner.schedule);
        if let Some(entry) = schedule.permits.get_mut(&ticket) {
            let period = entry.period();
            entry.next = entry.next.map(|next| next.max(sent + period));
            // Both instants only moved later: the driver, if it sleeps for the old one, wakes
            // for nothing once and sleeps again.
            schedule.reschedule(ticket);
        }
    }

    /// Renew every renewed permit at once, whatever its schedule says, each time `moved`
    /// changes (the primary moved: behind Sentinels, after a failover), for as long as the
    /// `Redsem` is open.
    ///
    /// A grant or renewal that the old primary made after the promoted replica stopped
    /// following it is unknown to the new primary: the renewal answers that the permit is not
    /// held, and its holder is told at once ([`Renewable::lose`]) instead of at its next
    /// renewal, a third of a lease later. A renewal in flight when the primary moves may have
    /// gone to the old primary: its permit is renewed again as soon as it answers.
    #[cfg(feature = "sentinel")]
    pub(crate) fn renew_all_when(&self, mut moved: tokio::sync::watch::Receiver<u64>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        let closed = self.closed.clone();
        moved.mark_unchanged();
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    () = closed.cancelled() => return,
                    changed = moved.changed() => if changed.is_err() { return },
                }
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let now = clock::now();
                let due = lock(&inner.schedule).renew_all(now);
                if due > 0 {
                    tracing::info!(
                        permits = due,
                        "the primary moved: renewing every permit now"
                    );
                    inner.wake.notify_one();
                }
            }
        });
    }

    fn start_driver(&self) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let running = Running(self.inner.clone());
                runtime.spawn(drive(running, self.closed.clone()));
            }
            Err(_) => {
                // LeasePermit::start runs inside async code; without a runtime nothing can be
                // renewed, and the lease ends by itself.
                lock(&self.inner.schedule).running = false;
                tracing::warn!("no tokio runtime: permits are not renewed");
            }
        }
    }
}

impl Schedule {
    fn insert(&mut self, ticket: u64, entry: Entry, lease: Duration) {
        self.timers.insert((entry.at, ticket));
        self.permits.insert(ticket, entry);
        *self.leases.entry(lease).or_default() += 1;
    }

    fn remove(&mut self, ticket: u64) -> Option<Entry> {
        let entry = self.permits.remove(&ticket)?;
        self.timers.remove(&(entry.at, ticket));
        let lease = entry.state.lease();
        if let Some(count) = self.leases.get_mut(&lease) {
            *count -= 1;
            if *count == 0 {
                self.leases.remove(&lease);
            }
        }
        Some(entry)
    }

    /// Make every renewed permit's renewal due at `now`; one in flight is renewed again when
    /// it answers. Returns how many permits are renewed.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    fn renew_all(&mut self, now: Duration) -> usize {
        let tickets: Vec<u64> = self
            .permits
            .iter()
            .filter(|(_, entry)| entry.next.is_some())
            .map(|(&ticket, _)| ticket)
            .collect();
        for &ticket in &tickets {
            if let Some(entry) = self.permits.get_mut(&ticket) {
                if entry.in_flight {
                    entry.again = true;
                } else {
                    entry.next = Some(now);
                }
            }
            self.reschedule(ticket);
        }
        tickets.len()
    }

    /// Move the timer of `ticket` to its entry's next event.
    fn reschedule(&mut self, ticket: u64) {
        if let Some(entry) = self.permits.get_mut(&ticket) {
            self.timers.remove(&(entry.at, ticket));
            entry.at = entry.event_at();
            self.timers.insert((entry.at, ticket));
        }
    }

    /// Handle every timer due at `now`: the permits whose validity has ended are taken out
    /// (returned in `lost`), the ones due for renewal are marked in flight (returned in
    /// `renew`). Returns how long the driver may sleep before the next event (`None`: until
    /// woken, nothing being scheduled), and notes when that is.
    fn fire(
        &mut self,
        now: Duration,
        renew: &mut Vec<(u64, Arc<dyn Renewable>)>,
        lost: &mut Vec<Arc<dyn Renewable>>,
    ) -> Option<Duration> {
        while let Some(&(at, ticket)) = self.timers.first() {
            if at > now {
                break;
            }
            let Some(entry) = self.permits.get_mut(&ticket) else {
                self.timers.pop_first();
                continue;
            };
            if now >= entry.state.valid_until() {
                if let Some(entry) = self.remove(ticket) {
                    lost.push(entry.state);
                }
                continue;
            }
            if let Some(next) = entry.next
                && next <= now
                && !entry.in_flight
            {
                entry.in_flight = true;
                renew.push((ticket, entry.state.clone()));
            }
            // Now later than `now`: a renewal in the future, or the validity.
            self.reschedule(ticket);
        }
        let nap = match self.timers.first() {
            Some(&(first, _)) => {
                let shortest = self.leases.first_key_value().map_or(first, |(l, _)| *l);
                Some(first.saturating_sub(now).min(shortest / 4))
            }
            // Nothing scheduled: sleep on until the wake-up set before, if it is still
            // ahead (a permit scheduled meanwhile whose timer comes before it wakes the
            // driver), else until woken.
            None => self
                .wakes_at
                .filter(|&wakes| wakes > now)
                .map(|wakes| wakes - now),
        };
        self.wakes_at = nap.map(|nap| now + nap);
        nap
    }

    /// A renewal of `ticket` answered (at `now`). Returns the permit if Redis said it is no
    /// longer held (it is taken out of the schedule).
    fn completed(
        &mut self,
        (ticket, outcome): Renewed,
        now: Duration,
    ) -> Option<Arc<dyn Renewable>> {
        let entry = self.permits.get_mut(&ticket)?;
        entry.in_flight = false;
        let period = entry.period();
        let again = std::mem::take(&mut entry.again);
        match outcome {
            Some(Ok(true)) if again => entry.next = Some(now),
            Some(Ok(true)) => entry.next = entry.next.map(|next| next.max(now) + period),
            Some(Ok(false)) => return self.remove(ticket).map(|entry| entry.state),
            Some(Err(err)) => {
                tracing::debug!(semaphore = %entry.state.semaphore(), id = %entry.state.id(),
                    error = %crate::error::Chain(&err), "renewal failed; retrying");
                entry.next = Some(now + RETRY_AFTER_ERROR.min(period));
            }
            // Cancelled: the permit left the schedule, so it is not found above.
            None => {}
        }
        self.reschedule(ticket);
        None
    }
}

/// Marks the driver gone when its future is dropped (returned, or its runtime shut down), so
/// that the next permit starts another.
struct Running(Arc<Inner>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut schedule = lock(&self.0.schedule);
        schedule.running = false;
        schedule.wakes_at = None;
    }
}

/// The driver: fires due timers, keeps the renewals in flight, and sleeps until the next
/// event, a new earlier timer, or the `Redsem` closing.
async fn drive(running: Running, closed: CancellationToken) {
    let inner = &running.0;
    let mut renewals = FuturesUnordered::new();
    let mut renew = Vec::new();
    let mut lost = Vec::new();
    loop {
        let nap = lock(&inner.schedule).fire(clock::now(), &mut renew, &mut lost);
        for state in lost.drain(..) {
            state.lose("lease may have ended without a renewal");
        }
        for (ticket, state) in renew.drain(..) {
            renewals.push(renewal(ticket, state));
        }
        tokio::select! {
            biased;
            () = closed.cancelled() => return,
            Some(renewed) = renewals.next(), if !renewals.is_empty() => {
                let gone = lock(&inner.schedule).completed(renewed, clock::now());
                if let Some(state) = gone {
                    state.lose("Redis no longer has it");
                }
            }
            () = inner.wake.notified() => {}
            () = tokio::time::sleep(nap.unwrap_or_default()), if nap.is_some() => {}
        }
    }
}

/// One renewal, cancelled if the permit is lost, released or dropped meanwhile (a forgotten
/// permit's renewal runs to its end, and its answer is ignored).
async fn renewal(ticket: u64, state: Arc<dyn Renewable>) -> Renewed {
    tokio::select! {
        biased;
        () = state.gone() => (ticket, None),
        outcome = state.refresh() => (ticket, Some(outcome.map(|sent| sent.is_some()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permit that only answers what the schedule asks.
    struct Fake {
        ticket: u64,
        id: PermitId,
        /// Its local validity (on [`clock`]).
        valid_until: Duration,
    }

    impl Renewable for Fake {
        fn ticket(&self) -> u64 {
            self.ticket
        }
        fn lease(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn valid_until(&self) -> Duration {
            self.valid_until
        }
        fn semaphore(&self) -> &str {
            "s"
        }
        fn id(&self) -> &PermitId {
            &self.id
        }
        fn lose(&self, _why: &str) {}
        fn gone(&self) -> BoxFuture<'_, ()> {
            Box::pin(std::future::pending())
        }
        fn refresh(&self) -> BoxFuture<'_, Result<Option<Duration>>> {
            Box::pin(async { Ok(None) })
        }
    }

    fn entry(ticket: u64, next: Option<Duration>) -> Entry {
        let mut entry = Entry {
            state: Arc::new(Fake {
                ticket,
                id: PermitId::random(),
                valid_until: Duration::from_secs(1_000),
            }),
            at: Duration::ZERO,
            next,
            in_flight: false,
            again: false,
        };
        entry.at = entry.event_at();
        entry
    }

    #[test]
    fn after_a_move_every_renewed_permit_is_due_at_once_and_one_in_flight_again_on_its_answer() {
        let mut schedule = Schedule::default();
        let lease = Duration::from_secs(30);
        let now = Duration::from_secs(100);
        // Renewed at 110 s; renewed, its renewal in flight; not renewed.
        schedule.insert(1, entry(1, Some(Duration::from_secs(110))), lease);
        schedule.insert(2, entry(2, Some(Duration::from_secs(99))), lease);
        schedule.insert(3, entry(3, None), lease);
        let (mut renew, mut lost) = (Vec::new(), Vec::new());
        schedule.fire(now, &mut renew, &mut lost);
        assert_eq!(
            renew.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [2],
            "only the due one"
        );
        renew.clear();

        assert_eq!(schedule.renew_all(now), 2, "the two renewed permits");
        schedule.fire(now, &mut renew, &mut lost);
        assert_eq!(
            renew.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [1],
            "the idle one at once"
        );
        assert!(schedule.permits[&2].again, "the one in flight is marked");

        // Its answer (from the old primary, maybe) makes it due at once, not a third later.
        let later = now + Duration::from_millis(5);
        assert!(schedule.completed((2, Some(Ok(true))), later).is_none());
        assert_eq!(schedule.permits[&2].next, Some(later));
        assert!(!schedule.permits[&2].again);
        // An answer without a move schedules the next renewal a third of the lease later.
        assert!(schedule.completed((1, Some(Ok(true))), later).is_none());
        assert_eq!(schedule.permits[&1].next, Some(later + lease / 3));
        assert!(schedule.permits[&3].next.is_none(), "not renewed stays so");
    }

    #[tokio::test]
    async fn a_new_permit_is_renewed_after_a_third_of_its_lease_or_within_half_of_what_is_left() {
        let keepalive = Keepalive::new(CancellationToken::new());
        let lease = Duration::from_secs(30);
        let before = clock::now();
        // Plenty of validity left: the first renewal a third of the lease from now.
        let long = Arc::new(Fake {
            ticket: keepalive.ticket(),
            id: PermitId::random(),
            valid_until: before + Duration::from_secs(100),
        });
        keepalive.schedule(long.clone(), true);
        // A grant handed over with 8 s of validity left: within half of that.
        let short = Arc::new(Fake {
            ticket: keepalive.ticket(),
            id: PermitId::random(),
            valid_until: before + Duration::from_secs(8),
        });
        keepalive.schedule(short.clone(), true);
        let after = clock::now();
        // (The driver was spawned but has not run: this test's thread never yielded.)
        let schedule = lock(&keepalive.inner.schedule);
        let next = |ticket| schedule.permits[&ticket].next.expect("renewed");
        let first = next(long.ticket);
        assert!(
            first >= before + lease / 3 && first <= after + lease / 3,
            "{first:?} is not a third of the lease after {before:?}"
        );
        let soon = next(short.ticket);
        assert!(
            soon >= before + Duration::from_secs(4) - (after - before)
                && soon <= after + Duration::from_secs(4),
            "{soon:?} is not half of the 8 s left after {before:?}"
        );
        assert_eq!(schedule.leases.get(&lease), Some(&2));
    }

    #[test]
    fn a_permit_taken_out_leaves_no_timer_and_no_lease_behind() {
        let mut schedule = Schedule::default();
        let lease = Duration::from_secs(30);
        schedule.insert(1, entry(1, Some(Duration::from_secs(110))), lease);
        schedule.insert(2, entry(2, Some(Duration::from_secs(120))), lease);
        assert!(schedule.remove(1).is_some());
        assert_eq!(schedule.leases.get(&lease), Some(&1), "one permit left");
        assert!(schedule.remove(2).is_some());
        assert!(schedule.remove(2).is_none(), "taken out once");
        assert!(schedule.timers.is_empty() && schedule.permits.is_empty());
        // The driver wakes at least every quarter of the shortest lease it still follows.
        assert!(schedule.leases.is_empty(), "{:?}", schedule.leases);
    }
}
