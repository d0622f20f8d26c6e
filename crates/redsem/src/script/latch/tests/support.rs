//! What the latch script tests share: the test latch's keys by name, its calls as the tests
//! make them, and the set-ups several files make.

use std::ops::Deref;

pub(super) use std::sync::Arc;
pub(super) use std::time::Duration;

pub(super) use redis::AsyncCommands;
pub(super) use redis::Value;
pub(super) use redsem_test::{RedisServer, within};

pub(super) use crate::script::latch::*;
pub(super) use crate::script::library::LATCH_COUNT_DOWN;
pub(super) use crate::script::test_support::{
    Conn, LIMIT, assert_nothing_published, assert_wrong_type, connect, connect_without_channels,
    evict_by_filling, load_for_multi, load_script, next_message, number, only_a_foreign_list_at,
    pttl, raw, server_millis, session, start_server, subscribe,
};
pub(super) use crate::session::{Hex, Session};

/// The test latch's keys by name; as [`LatchKeys`] (their order in KEYS, and its channel)
/// through `Deref`.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    keys: LatchKeys,
    /// The count left.
    pub(super) count: String,
    /// The marker of a latch that opened.
    pub(super) done: String,
    /// The session records' index: each record's expiry.
    pub(super) applied: String,
    /// The session records.
    pub(super) sessions: String,
}

impl Deref for Keys {
    type Target = LatchKeys;

    fn deref(&self) -> &LatchKeys {
        &self.keys
    }
}

impl From<LatchKeys> for Keys {
    fn from(keys: LatchKeys) -> Self {
        let [count, done, applied, sessions] = keys.all.clone();
        Keys {
            keys,
            count,
            done,
            applied,
            sessions,
        }
    }
}

/// The keys of the latch every test uses (`l`, under the prefix `t`).
pub(super) fn lk() -> Keys {
    LatchKeys::new("t", "l").into()
}

/// A throwaway server, a connection to it and the test latch's keys.
pub(super) async fn start() -> (RedisServer, Conn, Keys) {
    let server = start_server(&[]);
    let conn = connect(&server).await;
    (server, conn, lk())
}

/// Set the test latch to `n` (a `try_set` numbered after `s`, which finds it never set).
pub(super) async fn set_count(conn: &mut Conn, n: u64) {
    assert!(
        latch_try_set(conn, &lk(), n, caller("s"))
            .await
            .expect("set")
    );
}

/// [`start`], the latch then set to `n` ([`set_count`]).
pub(super) async fn start_with_count(n: u64) -> (RedisServer, Conn, Keys) {
    let (server, mut conn, k) = start().await;
    set_count(&mut conn, n).await;
    (server, conn, k)
}

/// The call `name` of the test session (the same name: the same call, resent).
pub(super) fn caller(name: &str) -> Caller<'static> {
    Caller::new(session(), number(name))
}
