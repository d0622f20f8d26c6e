//! `CountDownLatch`: a count that opens every waiter, in every process, when it reaches zero.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::client::Redsem;
use crate::error::{Error, Result, invalid};
use crate::keys::LatchKeys;
use crate::observe::{Attempt, Meter, op_span};
use crate::permits::MAX_PERMITS;
use crate::retry::retry_once;
use crate::script::{self, RawLatchState};
use crate::session::Caller;
use crate::wait;

/// How long an opened latch is reported as [`LatchState::Done`] (then as
/// [`LatchState::NeverSet`]).
pub const LATCH_DONE_TTL: Duration = Duration::from_secs(3600);

/// The shortest re-check interval accepted.
const MIN_RECHECK: Duration = Duration::from_millis(10);

/// Options of a [`CountDownLatch`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let options = redsem::LatchOptions::default().recheck(Duration::from_millis(250));
/// assert_eq!(options.recheck, Duration::from_millis(250));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatchOptions {
    /// How often a waiter re-checks the count without a wake-up (default 1 s): the most a lost
    /// pub/sub message can delay it.
    pub recheck: Duration,
}

impl Default for LatchOptions {
    fn default() -> Self {
        LatchOptions {
            recheck: Duration::from_secs(1),
        }
    }
}

impl LatchOptions {
    /// Set the re-check interval.
    #[must_use]
    pub fn recheck(mut self, recheck: Duration) -> Self {
        self.recheck = recheck;
        self
    }
}

/// What a [`CountDownLatch`] is doing, from [`CountDownLatch::state`].
///
/// With the `serde` feature it serializes as `{"state":"counting","count":2}`: the state
/// [`as_str`](Self::as_str) names, and the count-downs to go (0 unless counting), as the
/// `latch` of a [`StatusReport`](crate::StatusReport).
///
/// # Examples
///
/// ```
/// use redsem::LatchState;
/// let state = LatchState::Counting(2);
/// assert!(!state.is_open());
/// assert!(LatchState::Done.is_open());
/// assert_eq!(LatchState::Done.as_str(), "open");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LatchState {
    /// Never set, deleted, or opened more than [`LATCH_DONE_TTL`] ago.
    NeverSet,
    /// Set and not yet at zero: this many count-downs remain.
    Counting(u64),
    /// Reached zero within the last [`LATCH_DONE_TTL`].
    Done,
}

impl LatchState {
    /// True unless counting: a [`CountDownLatch::wait`] would return at once.
    pub fn is_open(self) -> bool {
        !matches!(self, LatchState::Counting(_))
    }

    /// The state's name, as `redsem status` and the `serde` feature write it: `"never-set"`,
    /// `"counting"` or `"open"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LatchState::NeverSet => "never-set",
            LatchState::Counting(_) => "counting",
            LatchState::Done => "open",
        }
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for LatchState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let count = match self {
            LatchState::Counting(n) => *n,
            LatchState::NeverSet | LatchState::Done => 0,
        };
        let mut out = s.serialize_struct("LatchState", 2)?;
        out.serialize_field("state", self.as_str())?;
        out.serialize_field("count", &count)?;
        out.end()
    }
}

/// A countdown latch shared through Redis, like Redisson's `RCountDownLatch`: set a count
/// once, count it down from anywhere, and every waiter in every process returns when it
/// reaches zero.
///
/// * At zero the latch is gone (its count key is deleted) and a message on its channel wakes
///   every waiter through each client's one shared pub/sub connection; a waiter also re-checks
///   every [`LatchOptions::recheck`], so a lost message costs latency, never liveness.
/// * [`wait`](Self::wait) returns at once for a latch that is not counting, whether it opened
///   or was never set; [`state`](Self::state) tells the two apart (an opened latch is
///   remembered as [`LatchState::Done`] for [`LATCH_DONE_TTL`]).
/// * [`count_down`](Self::count_down) is retry-safe: each call carries its number in the
///   client's session, is retried once after a dropped connection (or resent by the cluster
///   client), and is applied once.
/// * A waiter is never released by lost state: if the latch it saw counting vanishes (restart
///   without persistence, `FLUSHALL`, failover), it gets [`Error::StateLost`] (see
///   [`wait`](Self::wait)). While it counts, none of its keys has a TTL, so `volatile-*`
///   eviction cannot pick them.
///
/// Cloning is cheap.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> redsem::Result<()> {
/// let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379").await?;
/// let ready = redsem.count_down_latch("workers-ready")?;
/// ready.try_set_count(3).await?;
/// // ... in each of three workers, possibly on other machines:
/// ready.count_down().await?;
/// // ... in the coordinator:
/// ready.wait().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CountDownLatch {
    inner: Arc<LatchInner>,
}

#[derive(Debug)]
struct LatchInner {
    redsem: Redsem,
    name: String,
    keys: LatchKeys,
    options: LatchOptions,
    meter: Meter,
}

impl CountDownLatch {
    /// A handle on the latch `name` of `redsem` (see [`Redsem::count_down_latch_with`]); no
    /// round trip.
    pub(crate) fn new(redsem: &Redsem, name: &str, options: LatchOptions) -> Result<Self> {
        if name.is_empty() {
            return Err(invalid("the latch name must not be empty"));
        }
        if options.recheck < MIN_RECHECK {
            return Err(invalid(format!(
                "re-check interval {:?} is too short; the minimum is {MIN_RECHECK:?}",
                options.recheck
            )));
        }
        let mut keys = LatchKeys::new(redsem.prefix(), name);
        if redsem.sharded_wake_ups() {
            // On a cluster, "opened" goes by sharded pub/sub in the latch's slot.
            keys.channel = crate::keys::shard_latch_channel(redsem.prefix(), name);
        }
        Ok(CountDownLatch {
            inner: Arc::new(LatchInner {
                redsem: redsem.clone(),
                name: name.to_owned(),
                keys,
                options,
                meter: Meter::new("latch", name, &redsem.shared.metric_names),
            }),
        })
    }
}

impl CountDownLatch {
    /// The latch's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The options of this handle.
    pub fn options(&self) -> &LatchOptions {
        &self.inner.options
    }

    /// Set the count to `count` unless the latch is counting already. Returns true if this
    /// call set it. An opened latch can be set again.
    ///
    /// Retry-safe: after a dropped connection the call is repeated once with the same number
    /// in the client's session, and answers true if the first attempt set it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(latch: redsem::CountDownLatch) -> redsem::Result<()> {
    /// if !latch.try_set_count(3).await? {
    ///     println!("already counting: {}", latch.count().await?);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or a count above 2<sup>53</sup> - 1;
    /// [`Error::WrongType`] when one of its keys holds a foreign value (left untouched);
    /// [`Error::Unavailable`] when Redis cannot be reached (also on the retry).
    ///
    /// # Cancel safety
    ///
    /// If dropped after sending, the count may or may not have been set.
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        if count == 0 || count > MAX_PERMITS.unsigned_abs() {
            return Err(invalid(format!(
                "the count of latch {:?} must be 1..={MAX_PERMITS}, got {count}",
                self.inner.name
            )));
        }
        let inner = &self.inner;
        let seq = inner.redsem.session().open();
        let span = op_span!(inner.meter, "redsem.latch.try_set");
        span.record("units", count);
        retry_once("try_set_count", || async {
            script::latch_try_set(
                &mut inner.redsem.conn(),
                &inner.keys,
                count,
                Caller::new(inner.redsem.session(), seq.n()),
            )
            .await
        })
        .instrument(span)
        .await
    }

    /// Take one from the count; at zero the latch opens: it is gone, and every waiter returns.
    /// Answers the count-downs left after this one (`Some(0)`: this one opened the latch), or
    /// `None` when the latch was not counting (never set, opened, deleted): then it did
    /// nothing. A resent call answers what it did the first time.
    /// Retry-safe: after a dropped connection the call is repeated once with the same number
    /// in the client's session, and applied once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(latch: redsem::CountDownLatch) -> redsem::Result<()> {
    /// if latch.count_down().await? == Some(0) {
    ///     println!("the last one: the latch is open");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::Unavailable`] as for
    /// [`try_set_count`](Self::try_set_count).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once called, the count-down happens (in the background if this
    /// future is dropped before it answers); only its answer is lost.
    pub async fn count_down(&self) -> Result<Option<u64>> {
        let inner = self.inner.clone();
        let span = op_span!(inner.meter, "redsem.latch.count_down");
        // Run to its end even if this future is dropped: a count-down, once called, happens.
        self.inner
            .redsem
            .run_to_end(
                async move {
                    let seq = inner.redsem.session().open();
                    let counted = retry_once("count_down", || async {
                        script::latch_count_down(
                            &mut inner.redsem.conn(),
                            &inner.keys,
                            Caller::new(inner.redsem.session(), seq.n()),
                        )
                        .await
                    })
                    .await?;
                    inner.meter.counted_down();
                    Ok(match counted {
                        script::CountDown::Counted(left) | script::CountDown::Repeated(left) => {
                            Some(left)
                        }
                        script::CountDown::Absent => None,
                    })
                }
                .instrument(span),
            )
            .await
    }

    /// The count-downs remaining: 0 when the latch is not counting (opened, never set or
    /// deleted; [`state`](Self::state) tells which).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(latch: redsem::CountDownLatch) -> redsem::Result<()> {
    /// println!("{} to go", latch.count().await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; [`Error::Unavailable`] when Redis cannot be reached (the read is
    /// tried once more after a dropped connection).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn count(&self) -> Result<u64> {
        Ok(match self.state().await? {
            LatchState::Counting(n) => n,
            LatchState::NeverSet | LatchState::Done => 0,
        })
    }

    /// Whether the latch is counting, opened (within [`LATCH_DONE_TTL`]), or never set.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(latch: redsem::CountDownLatch) -> redsem::Result<()> {
    /// use redsem::LatchState;
    /// match latch.state().await? {
    ///     LatchState::NeverSet => println!("nobody set it up (yet)"),
    ///     LatchState::Counting(n) => println!("{n} to go"),
    ///     LatchState::Done => println!("open"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; [`Error::Unavailable`] when Redis cannot be reached (the read is
    /// tried once more after a dropped connection).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn state(&self) -> Result<LatchState> {
        Ok(match self.raw_state().await? {
            RawLatchState::Counting(n) => LatchState::Counting(n),
            RawLatchState::Done => LatchState::Done,
            RawLatchState::Deleted | RawLatchState::Never => LatchState::NeverSet,
        })
    }

    /// Wait until the latch is not counting: it reached zero, was deleted, or was never set
    /// (check [`state`](Self::state) first where "never set" must not pass).
    ///
    /// # Lost state
    ///
    /// A waiter that saw the latch counting returns only when it opens (or is
    /// [deleted](Self::delete)). If the latch's keys vanish instead — a restart without
    /// persistence, `FLUSHALL`, a failover to a replica that had not received the
    /// [`try_set_count`](Self::try_set_count), eviction under an `allkeys-*` policy — the
    /// waiter gets [`Error::StateLost`], never a false opening: nobody could count such a
    /// latch down any more ([`count_down`](Self::count_down) finds nothing to count). Set it
    /// again and wait again if that is the right recovery. A failover to a replica that missed
    /// only some count-downs leaves the latch counting from the replica's count: its waiters
    /// go on waiting, and the lost count-downs must be repeated (use
    /// [`wait_timeout`](Self::wait_timeout) where that matters). The same error comes, as a
    /// false alarm, if the latch opened and its done marker is gone before the waiter
    /// re-checked: more than [`LATCH_DONE_TTL`] later (a process suspended that long), or
    /// evicted by a `volatile-*` policy in the milliseconds after the opening.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(latch: redsem::CountDownLatch) -> redsem::Result<()> {
    /// latch.wait().await?;
    /// println!("everyone is ready");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::StateLost`] when the latch it saw counting vanished without opening (see
    /// above); [`Error::WrongType`]; [`Error::Unavailable`] when Redis cannot be reached for
    /// the first check. Once it saw the latch counting, a waiter rides out an outage: a check
    /// that cannot reach Redis is logged and repeated every [`LatchOptions::recheck`] (bound
    /// the wait with [`wait_timeout`](Self::wait_timeout)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: waiting changes nothing in Redis.
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await
    }

    /// Wait until the latch is not counting, for at most `wait`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(latch: redsem::CountDownLatch) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// match latch.wait_timeout(Duration::from_secs(30)).await {
    ///     Ok(()) => println!("open"),
    ///     Err(e) if e.is_timeout() => println!("still {} to go", latch.count().await?),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when `wait` runs out; otherwise as [`wait`](Self::wait).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wait_timeout(&self, wait: Duration) -> Result<()> {
        self.wait_until(Instant::now().checked_add(wait)).await
    }

    /// Remove the latch. Returns true if it was counting; its waiters then return (a marker
    /// kept for [`LATCH_DONE_TTL`] tells them it was deleted, not lost), and
    /// [`state`](Self::state) reports [`LatchState::NeverSet`]. Deleting a latch that is not
    /// counting also removes its done marker.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(latch: redsem::CountDownLatch) -> redsem::Result<()> {
    /// latch.delete().await?;
    /// assert_eq!(latch.state().await?, redsem::LatchState::NeverSet);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] (nothing is deleted), [`Error::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// If dropped after sending, the latch may or may not have been deleted.
    pub async fn delete(&self) -> Result<bool> {
        let inner = &self.inner;
        script::latch_delete(&mut inner.redsem.conn(), &inner.keys).await
    }

    async fn raw_state(&self) -> Result<RawLatchState> {
        let inner = &self.inner;
        retry_once("state", || async {
            script::latch_state(&mut inner.redsem.conn(), &inner.keys).await
        })
        .await
    }

    /// Whether a waiter that saw the latch counting goes on waiting (`Ok(true)`), may return
    /// (`Ok(false)`: it opened or was deleted), or must report the latch lost.
    async fn still_counting(&self) -> Result<bool> {
        match self.raw_state().await? {
            RawLatchState::Counting(_) => Ok(true),
            RawLatchState::Done | RawLatchState::Deleted => Ok(false),
            RawLatchState::Never => Err(Error::StateLost {
                name: self.inner.name.clone(),
                detail: "the latch was counting and is now neither counting, opened nor \
                         deleted: its keys vanished (restart without persistence, FLUSHALL, \
                         failover to a replica that missed them, eviction)"
                    .into(),
            }),
        }
    }

    /// The wait, measured ([`crate::observe`]) and run in its span.
    async fn wait_until(&self, deadline: Option<Instant>) -> Result<()> {
        let meter = &self.inner.meter;
        let attempt = Attempt::start(meter, op_span!(meter, "redsem.latch.wait"), None);
        let result = self
            .wait_unmeasured(deadline)
            .instrument(attempt.span().clone())
            .await;
        attempt.finish(&result);
        result
    }

    async fn wait_unmeasured(&self, deadline: Option<Instant>) -> Result<()> {
        let started = Instant::now();
        if !matches!(self.raw_state().await?, RawLatchState::Counting(_)) {
            return Ok(());
        }
        let inner = &self.inner;
        let listener = inner
            .redsem
            .notifier()
            .await
            .listen(&inner.keys.channel)
            .await;
        loop {
            // Registered before the check, so a message published in between is kept.
            let mut opened = pin!(listener.notify().notified());
            opened.as_mut().enable();
            match self.still_counting().await {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                // Rides out an outage (a restart, a failover): what it saw stays known, so a
                // latch that comes back empty is reported lost, not passed as open.
                Err(err) if err.is_unavailable() => {
                    tracing::warn!(latch = %inner.name, error = %crate::error::Chain(&err), "cannot check the latch; re-checking later");
                }
                Err(err) => return Err(err),
            }
            if !wait::nap(opened, inner.options.recheck, deadline).await {
                return Err(wait::timeout(&inner.name, started));
            }
        }
    }
}
