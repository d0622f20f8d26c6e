//! What the lease script tests share: the test semaphore's keys by name, its requests, the
//! calls as the tests make them, and the set-ups several files make.

use std::ops::Deref;

pub(super) use std::time::Duration;

pub(super) use redis::AsyncCommands;
pub(super) use redsem_test::{RedisServer, within};

pub(super) use crate::error::Error;
pub(super) use crate::script::lease::*;
pub(super) use crate::script::library::Op;
pub(super) use crate::script::test_support::{
    CHANNEL, Conn, LIMIT, Raw, assert_nothing_published, connect, connect_cluster, connect_with,
    connect_without_channels, load_for_multi, load_script, next_message, number, op_command,
    plant_now, pttl, raw, server_micros, server_millis, session, start_cluster, start_server,
    subscribe,
};
pub(super) use crate::session::Hex;

/// The test semaphore's keys by name; as [`LeaseKeys`] (their order in KEYS) through `Deref`.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    keys: LeaseKeys,
    /// Lease ends of holders and waiters, and minus the expiry of each session record.
    pub(super) leases: String,
    /// The waiters in queue order.
    pub(super) queue: String,
    /// The state hash: counters, records, hints.
    pub(super) state: String,
    /// The slot bitmap.
    pub(super) slots: String,
    /// The turns: tenants waiting whose head fits their cap, by held / weight.
    pub(super) tenants: String,
    /// Named tenants' waiters, one lex range per tenant.
    pub(super) tqueue: String,
}

impl Deref for Keys {
    type Target = LeaseKeys;

    fn deref(&self) -> &LeaseKeys {
        &self.keys
    }
}

impl From<LeaseKeys> for Keys {
    fn from(keys: LeaseKeys) -> Self {
        let [leases, queue, state, slots, tenants, tqueue] = keys.all.clone();
        Keys {
            keys,
            leases,
            queue,
            state,
            slots,
            tenants,
            tqueue,
        }
    }
}

/// The keys of the semaphore every test uses (`s`, under the prefix `t`).
pub(super) fn keys() -> Keys {
    LeaseKeys::new("t", "s").into()
}

/// A throwaway server, a connection to it and the test semaphore's keys.
pub(super) async fn start() -> (RedisServer, Conn, Keys) {
    let server = start_server(&[]);
    let conn = connect(&server).await;
    (server, conn, keys())
}

/// A holder's release numbered after `name` in the test session.
pub(super) fn by(name: &str) -> ReleaseBy<'static> {
    ReleaseBy::Holder(Caller::new(session(), number(name)))
}

/// A request of `units` of capacity `capacity` by `id`, waiting or not: 30 s leases, no
/// label, numbered after its id in the test session (so that the same request again is a
/// resend).
pub(super) fn req<'a>(id: &'a str, capacity: u32, units: u32, wait: bool) -> Request<'a> {
    Request {
        id,
        capacity,
        units,
        lease: Duration::from_secs(30),
        label: "",
        one_per_label: false,
        wait,
        waiter_lease: Duration::from_secs(30),
        channel: CHANNEL,
        call: Caller::new(session(), number(id)),
        tenant: None,
    }
}

/// `lease_acquire` of `r` on the test semaphore; panics on an error.
pub(super) async fn acquire(conn: &mut Conn, r: Request<'_>) -> Acquire {
    within(LIMIT, "lease_acquire", lease_acquire(conn, &keys(), &r))
        .await
        .expect("lease_acquire")
}

/// `lease_release` from a client whose channel is not [`CHANNEL`], so grants to waiters on
/// it are published; the release is numbered after `id`, so calling it again is a resend.
pub(super) async fn release(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    id: &str,
) -> Result<Release> {
    lease_release(
        conn,
        keys,
        id,
        "t:wake:another",
        by(&format!("release {id}")),
    )
    .await
    .map(|r| r.outcome)
}

/// The token and slots of a grant; panics on any other reply.
#[track_caller]
pub(super) fn granted(reply: Acquire) -> (u64, Vec<u32>) {
    match reply {
        Acquire::Granted { token, slots } => (token, slots),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// [`crate::MAX_UNITS`], as the scripts' tests use it.
pub(super) const MAX_UNITS_FOR_TESTS: u32 = crate::types::MAX_UNITS;

/// The score of `id` in the leases zset (its lease end, or minus a session record's expiry).
pub(super) async fn lease_score(conn: &mut Conn, id: &str) -> Option<i64> {
    let score: Option<f64> = conn.zscore(&keys().leases, id).await.expect("ZSCORE");
    #[allow(clippy::cast_possible_truncation)]
    score.map(|s| s as i64)
}

/// The state hash as a sorted list of fields, without `next` and `tnext` (settle's hints)
/// and `idle` (absent or 0 while live: the same).
pub(super) async fn state_fields(conn: &mut Conn) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = conn.hgetall(&keys().state).await.expect("hgetall");
    all.retain(|(name, _)| !matches!(name.as_str(), "next" | "tnext" | "idle"));
    all.sort();
    all
}

/// Run `check` until one try ran with less than 3 ms between the server-time reads around
/// the step it measures (it answers whether it did); 200 tries, each given its number (from 1,
/// for ids of its own), a connection of its own and the keys.
pub(super) async fn within_3_ms<F, Fut>(conn: &Conn, mut check: F)
where
    F: FnMut(u32, Conn, Keys) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for n in 1..=200 {
        if check(n, conn.clone(), keys()).await {
            return;
        }
    }
    panic!("no try ran within 3 ms in 200 tries");
}

/// A raw `lease_acquire` (try mode, one unit of capacity `cap`) in session `sid`, numbered
/// `seq`, carrying the low mark `low` as given (the typed wrapper computes it from a live
/// session, which can only raise it).
pub(super) async fn raw_acquire(
    conn: &mut Conn,
    id: &str,
    cap: u32,
    seq: u64,
    sid: &str,
    low: u64,
) -> Acquire {
    let reply: Value = within(
        LIMIT,
        "raw lease_acquire",
        raw(&LEASE_ACQUIRE)
            .key(&keys().all[..])
            .arg(id)
            .arg(cap)
            .arg(1)
            .arg(30_000)
            .arg("")
            .arg("0")
            .arg("try")
            .arg(30_000)
            .arg(CHANNEL)
            .arg(Hex(seq))
            .arg(sid)
            .arg(Hex(low))
            .invoke_async(conn),
    )
    .await
    .expect("lease_acquire");
    decode_acquire("lease_acquire", reply).expect("decode")
}

/// A raw holder's `lease_release` of `id` in session `sid`, numbered `seq`, carrying `low`.
pub(super) async fn raw_release(
    conn: &mut Conn,
    id: &str,
    seq: u64,
    sid: &str,
    low: u64,
) -> String {
    let reply: Vec<Value> = within(
        LIMIT,
        "raw lease_release",
        raw_release_call(id, seq, sid, low).invoke_async(conn),
    )
    .await
    .expect("lease_release");
    match reply.first() {
        Some(Value::BulkString(s)) => String::from_utf8_lossy(s).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        other => panic!("lease_release answered {other:?}"),
    }
}

/// The call [`raw_release`] makes, to add to a `MULTI` ([`Raw::add_to`]).
pub(super) fn raw_release_call(id: &str, seq: u64, sid: &str, low: u64) -> Raw {
    raw(&LEASE_RELEASE)
        .key(&keys().all[..])
        .arg(id)
        .arg("t:wake:another")
        .arg(Hex(seq))
        .arg(sid)
        .arg(Hex(low))
        .arg("r")
}

/// A raw `lease_batch` in session `sid` carrying the low mark `low`, of the operations whose
/// arguments `ops` gives (each operation's kind first); the replies to them.
pub(super) async fn raw_batch(
    conn: &mut Conn,
    sid: &str,
    low: u64,
    ops: impl redis::ToRedisArgs,
) -> Vec<Value> {
    let reply: Vec<Value> = within(
        LIMIT,
        "lease_batch",
        raw(&LEASE_BATCH)
            .key(&keys().all[..])
            .arg(CHANNEL)
            .arg(sid)
            .arg(Hex(low))
            .arg(ops)
            .invoke_async(conn),
    )
    .await
    .expect("lease_batch");
    let Some(Value::Array(replies)) = reply.first() else {
        panic!("lease_batch answered {reply:?}");
    };
    replies.clone()
}

/// `lease_acquire` of `r` on the test semaphore, its result as the call gave it.
pub(super) async fn acquire_result(conn: &mut Conn, r: Request<'_>) -> Result<Acquire> {
    within(LIMIT, "lease_acquire", lease_acquire(conn, &keys(), &r)).await
}

/// What each of a batch's releases answered.
pub(super) fn release_outcomes(batch: &BatchReply) -> Vec<Release> {
    batch
        .replies
        .iter()
        .map(|r| batch_release(r.clone(), None).expect("release"))
        .collect()
}

/// The ARGV of a `lease_acquire` of `r` in `mode` (`try` or `wait`), unlabelled, in the test
/// session.
pub(super) fn acquire_args(r: &Request<'_>, mode: &str) -> Vec<String> {
    vec![
        r.id.to_owned(),
        r.capacity.to_string(),
        r.units.to_string(),
        millis(r.lease).to_string(),
        String::new(),
        "0".to_owned(),
        mode.to_owned(),
        millis(r.waiter_lease).to_string(),
        CHANNEL.to_owned(),
        Hex(r.call.seq).to_string(),
        session().id().to_owned(),
        Hex(session().low()).to_string(),
    ]
}

/// A call of `op` with the test semaphore's keys, to add to a `MULTI` (its arguments after):
/// `FCALL`, or the module's command ([`op_command`]).
pub(super) fn multi_call(op: &Op) -> redis::Cmd {
    op_command(op, &keys().all)
}

/// `EVAL` of `script` with `keys`, to add to a `MULTI` (its arguments after): how a test plants
/// a value computed from the Redis time in the very transaction of the call it tests.
pub(super) fn eval(script: &str, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len()).arg(keys);
    cmd
}

/// `lease_acquire` of `r` (try mode) in the test session, as a command to add to a `MULTI`
/// after a script that plants the time ([`multi_call`]).
pub(super) fn multi_try_acquire(r: &Request<'_>) -> redis::Cmd {
    let mut cmd = multi_call(&LEASE_ACQUIRE);
    cmd.arg(acquire_args(r, "try"));
    cmd
}

/// `lease_release` of holder `id` from a client whose channel is `channel`, numbered as
/// [`release`] numbers it, as a command to add to a `MULTI` ([`multi_call`]).
pub(super) fn multi_release(id: &str, channel: &str) -> redis::Cmd {
    let mut cmd = multi_call(&LEASE_RELEASE);
    cmd.arg(id)
        .arg(channel)
        .arg(Hex(number(&format!("release {id}"))))
        .arg(session().id())
        .arg(Hex(session().low()))
        .arg("r");
    cmd
}

/// A holder's release of `id` by a call of session `own`, answered before the next: the
/// session's low mark then passes the marks of its earlier releases, so a release of a
/// single unit with nobody queued takes the fast path (the test session's low mark never
/// moves, so its records keep every mark and its releases take the general path).
pub(super) async fn release_in(
    conn: &mut Conn,
    id: &str,
    own: &std::sync::Arc<Session>,
) -> Result<Release> {
    let seq = own.open();
    let by = ReleaseBy::Holder(Caller::new(own, seq.n()));
    lease_release(conn, &keys(), id, "t:wake:another", by)
        .await
        .map(|r| r.outcome)
}

/// A poll of `id` with 30 s leases.
pub(super) async fn poll(conn: &mut Conn, id: &str) -> Acquire {
    lease_poll(
        conn,
        &keys(),
        id,
        Duration::from_secs(30),
        Duration::from_secs(30),
    )
    .await
    .expect("poll")
}

/// Makes ARGV[1]'s score in KEYS[1] (leases) the Redis time plus ARGV[2] ms, and the field
/// `next` of KEYS[2] (the state: the first lease end) that end too; answers it.
pub(super) const PLANT_AHEAD: &str = "local t = redis.call('TIME') \
    local at = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2])) \
    redis.call('ZADD', KEYS[1], at, ARGV[1]) \
    redis.call('HSET', KEYS[2], 'next', at) \
    return at";

/// The Redis time in ms, read in a script (so that it can go in a MULTI).
pub(super) const NOW: &str =
    "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)";

/// Assert that `result` is the [`Error::WrongType`] that names `key`.
#[track_caller]
pub(super) fn expect_wrong_type<T: std::fmt::Debug>(result: Result<T>, key: &str) {
    match result {
        Err(Error::WrongType { key: got, .. }) => assert_eq!(got, key),
        other => panic!("expected WrongType, got {other:?}"),
    }
}

/// A session of its own whose first release (of `first`, granted on capacity `capacity`) made
/// its record: its next release of a single unit with nobody queued needs no renewal, and
/// takes the fast path.
pub(super) async fn session_past_a_release(
    conn: &mut Conn,
    capacity: u32,
) -> std::sync::Arc<Session> {
    let own = Session::new();
    granted(acquire(conn, req("first", capacity, 1, false)).await);
    release_in(conn, "first", &own).await.expect("release");
    own
}

/// Fields of the state hash, read raw (`HMGET`): no script runs, so nothing is settled first.
pub(super) async fn state_fields_raw<T: redis::FromRedisValue>(
    conn: &mut Conn,
    fields: &[&str],
) -> T {
    redis::cmd("HMGET")
        .arg(&keys().state)
        .arg(fields)
        .query_async(conn)
        .await
        .expect("hmget")
}

/// Assert that `id`'s entry in leases ends `lease` ms after a Redis time within `[t0, t1]`
/// (`what`: the lease it is, for the message).
pub(super) async fn assert_ends_after(
    conn: &mut Conn,
    id: &str,
    (t0, t1): (i64, i64),
    lease: i64,
    what: &str,
) {
    let ends = lease_score(conn, id).await.expect("granted");
    assert!(
        (t0 + lease..=t1 + lease).contains(&ends),
        "the grant ends at {ends}, {what} from [{t0}, {t1}]"
    );
}
