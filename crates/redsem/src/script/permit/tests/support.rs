//! What the permit script tests share: the test semaphore's keys by name, the scripts'
//! wrappers as the tests call them (each call numbered after its request id), and the
//! set-ups several files make.

use std::ops::Deref;

pub(super) use std::time::{Duration, Instant};

pub(super) use redis::AsyncCommands;
pub(super) use redsem_test::{RedisServer, within};

pub(super) use crate::error::Error;
pub(super) use crate::keys::LatchKeys;
pub(super) use crate::script::acks::Acked;
pub(super) use crate::script::latch::{
    CountDown, RawLatchState, latch_count_down, latch_delete, latch_state, latch_try_set,
};
pub(super) use crate::script::library::{
    Op, PERMIT_ACQUIRE, PERMIT_ADD, PERMIT_BATCH, PERMIT_POLL, PERMIT_TRY_SET,
};
pub(super) use crate::script::permit as script;
pub(super) use crate::script::permit::*;
pub(super) use crate::script::test_support::{
    CHANNEL, Conn, LIMIT, assert_nothing_published, assert_wrong_type, connect, connect_cluster,
    connect_without_channels, evict_by_filling, next_message, number, only_a_foreign_list_at,
    op_command, plant_now, pttl, server_millis, session, start_cluster, start_server, subscribe,
};
pub(super) use crate::session::{Caller, Hex, Session};

/// The test semaphore's keys by name; as [`PermitKeys`] (their order in KEYS) through `Deref`.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    keys: PermitKeys,
    /// The count of permits available.
    pub(super) count: String,
    /// The waiters, in arrival order.
    pub(super) queue: String,
    /// Each waiter's lease end.
    pub(super) waiters: String,
    /// The bookkeeping hash: request records, counters, session records, deadlines.
    pub(super) records: String,
    /// The ticket counter.
    pub(super) meta: String,
    /// The sessions' index: each session record's expiry.
    pub(super) applied: String,
}

impl Deref for Keys {
    type Target = PermitKeys;

    fn deref(&self) -> &PermitKeys {
        &self.keys
    }
}

impl From<PermitKeys> for Keys {
    fn from(keys: PermitKeys) -> Self {
        let [count, queue, waiters, records, meta, applied] = keys.all.clone();
        Keys {
            keys,
            count,
            queue,
            waiters,
            records,
            meta,
            applied,
        }
    }
}

/// The keys of the semaphore every test uses (`p`, under the prefix `t`).
pub(super) fn pk() -> Keys {
    PermitKeys::new("t", "p").into()
}

/// A throwaway server, a connection to it and the test semaphore's keys.
pub(super) async fn start() -> (RedisServer, Conn, Keys) {
    let server = start_server(&[]);
    let conn = connect(&server).await;
    (server, conn, pk())
}

/// Set the test semaphore's count to `n` (a `try_set` numbered after `s`, which finds it
/// never set).
pub(super) async fn set_count(conn: &mut Conn, n: u32) {
    assert!(permit_try_set(conn, &pk(), "s", n).await.expect("set"));
}

/// [`start`], the count then set to `n` ([`set_count`]).
pub(super) async fn start_with_count(n: u32) -> (RedisServer, Conn, Keys) {
    let (server, mut conn, k) = start().await;
    set_count(&mut conn, n).await;
    (server, conn, k)
}

/// The waiter lease most tests ask for.
pub(super) const LONG: Duration = Duration::from_secs(30);

/// The largest count, and the largest addition: 2^53 - 1, exact as a double.
pub(super) const MAX: i64 = (1 << 53) - 1;

/// The call `name` of the test session (the same name: the same call, resent).
pub(super) fn caller(name: &str) -> Caller<'static> {
    Caller::new(session(), number(name))
}

// The scripts' wrappers as the tests call them: each call numbered after its request id (a
// check-in after "poll <id>"), so that the same call made again is its resend.

pub(super) async fn permit_acquire(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
    permits: u32,
    wait: bool,
    waiter_lease: Duration,
    channel: &str,
) -> Result<PermitAcquire> {
    script::permit_acquire(
        conn,
        keys,
        id,
        permits,
        wait,
        waiter_lease,
        channel,
        caller(id),
    )
    .await
}

pub(super) async fn permit_poll(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
    waiter_lease: Duration,
) -> Result<PermitAcquire> {
    let call = caller(&format!("poll {id}"));
    script::permit_poll(conn, keys, id, waiter_lease, call).await
}

pub(super) async fn permit_add(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
    delta: i64,
) -> Result<Addition> {
    script::permit_add(conn, keys, request, delta, caller(request)).await
}

/// A withdrawal with no call of the request in flight.
pub(super) async fn permit_withdraw(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
) -> Result<Withdrawal> {
    script::permit_withdraw(conn, keys, id, session(), None).await
}

/// A withdrawal naming the call `name` of the request as unanswered (see [`number`]).
pub(super) async fn withdraw_naming(conn: &mut impl Scripting, id: &str, name: &str) -> Withdrawal {
    script::permit_withdraw(conn, &pk(), id, session(), Some(number(name)))
        .await
        .expect("withdraw")
}

pub(super) async fn permit_try_set(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
    permits: u32,
) -> Result<bool> {
    script::permit_try_set(conn, keys, request, permits, caller(request)).await
}

pub(super) async fn permit_drain(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
) -> Result<(u64, Option<Error>)> {
    script::permit_drain(conn, keys, request, caller(request)).await
}

pub(super) async fn permit_batch(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    channel: &str,
    ops: &[PermitOp],
) -> Result<(Vec<Value>, Option<Error>)> {
    script::permit_batch(conn, keys, channel, session(), ops).await
}

/// `permit_acquire` of `permits` by `id` on the test semaphore, from a client on [`CHANNEL`];
/// panics on an error.
pub(super) async fn acquire(
    conn: &mut Conn,
    id: &str,
    permits: u32,
    wait: bool,
    waiter_lease: Duration,
) -> PermitAcquire {
    within(
        LIMIT,
        "permit_acquire",
        permit_acquire(conn, &pk(), id, permits, wait, waiter_lease, CHANNEL),
    )
    .await
    .expect("permit_acquire")
}

/// A check-in of `id` (30 s waiter lease); panics on an error.
pub(super) async fn poll(conn: &mut Conn, id: &str) -> PermitAcquire {
    permit_poll(conn, &pk(), id, LONG).await.expect("poll")
}

/// An addition of `delta` numbered after `request`; panics on an error.
pub(super) async fn add(conn: &mut Conn, request: &str, delta: i64) -> Addition {
    permit_add(conn, &pk(), request, delta).await.expect("add")
}

/// The permits available; panics on an error.
pub(super) async fn available(conn: &mut Conn) -> i64 {
    permit_available(conn, &pk())
        .await
        .expect("available")
        .available
}

/// Fields of the bookkeeping hash, read raw (`HMGET`: no script runs, nothing is settled).
pub(super) async fn fields(conn: &mut Conn, names: &[&str]) -> Vec<Option<String>> {
    redis::cmd("HMGET")
        .arg(&pk().records)
        .arg(names)
        .query_async(conn)
        .await
        .expect("HMGET records")
}

/// The number of `r:<id>` records in state "granted, not collected".
pub(super) async fn uncollected(conn: &mut Conn) -> usize {
    let values: Vec<String> = conn.hvals(&pk().records).await.expect("HVALS");
    values.iter().filter(|v| v.starts_with("g|")).count()
}

/// Sleep until `at` (no more than `LIMIT`).
pub(super) async fn sleep_until(at: Instant) {
    let left = at.saturating_duration_since(Instant::now());
    assert!(left <= LIMIT, "a wait of {left:?}");
    tokio::time::sleep(left).await;
}

/// The replies of a batch, read one at a time in the order of its operations, each as its own
/// call's reply would be (nothing unconfirmed).
pub(super) fn one_by_one(replies: Vec<Value>) -> impl FnMut() -> Acked {
    let mut replies = replies.into_iter();
    move || Acked {
        reply: replies.next().expect("a reply per operation"),
        unconfirmed: None,
    }
}

/// A batch of `ops` made in `session` on the test semaphore (`permit_batch`, from a client on
/// [`CHANNEL`]); its replies, one at a time ([`one_by_one`]).
pub(super) async fn batch_in(
    conn: &mut Conn,
    session: &Session,
    ops: &[PermitOp],
) -> impl FnMut() -> Acked + use<> {
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        script::permit_batch(conn, &pk(), CHANNEL, session, ops),
    )
    .await
    .expect("permit_batch");
    one_by_one(replies)
}

/// A call of `op` with the test semaphore's keys, to add to a `MULTI` (its arguments after):
/// `FCALL`, or the module's command ([`op_command`]).
pub(super) fn multi_call(op: &Op) -> redis::Cmd {
    op_command(op, &pk().all)
}
