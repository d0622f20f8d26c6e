//! Through Sentinels: connecting by `redis+sentinel://` and `connect_sentinel`, and 16-way load
//! on one lease semaphore across a forced failover (`SENTINEL FAILOVER`), with a waiter
//! queued and a holder renewing through it.
//!
//! What is asserted is what the README's guarantees promise across a failover: fencing tokens
//! keep increasing in grant order (they are `max(last + 1, server time)`, one clock here), and
//! the holders' own view never has more than `capacity` holders at once, except with a grant
//! the promoted replica missed, whose holder then learns it (its release answers that it was
//! not held, or its `lost()` fires). Figures are printed with `eprintln!` for the reports;
//! nothing about them is asserted.

use std::sync::Arc;
use std::time::Duration;

use redsem::{Error, Redsem, RedsemOptions};
use redsem_test::RedisSentinels;

use crate::support::{LIMIT, within};

/// 16 tasks of one client on one semaphore across a forced failover.
mod load;

/// Three clients across a forced failover, with and without replica acknowledgements.
mod several_clients;

/// Finding the primary and following it: `connect_sentinel`, a database in the URL, a killed
/// primary, a client connecting as a failover ends, a holder the new primary does not know.
mod following_the_primary;

pub(super) async fn connect(deployment: &RedisSentinels, options: RedsemOptions) -> Redsem {
    within(
        LIMIT,
        "connect through the sentinels",
        Redsem::connect_with(&deployment.url(), options.prefix("t")),
    )
    .await
    .expect("connect through the sentinels")
}

/// Run a failover of `deployment` on a blocking thread; returns when every sentinel names the
/// new primary, with its port.
pub(super) async fn failover(deployment: &Arc<RedisSentinels>) -> u16 {
    let deployment = deployment.clone();
    within(
        Duration::from_secs(40),
        "SENTINEL FAILOVER",
        tokio::task::spawn_blocking(move || deployment.failover()),
    )
    .await
    .expect("the failover thread")
}

/// How many times each error occurs.
pub(super) fn count(errors: &[String]) -> std::collections::BTreeMap<&str, usize> {
    let mut counted = std::collections::BTreeMap::new();
    for e in errors {
        *counted.entry(e.as_str()).or_default() += 1;
    }
    counted
}

/// An error's variant name, for counting.
pub(super) fn kind(err: &Error) -> String {
    if let Error::Redis(cause) = err {
        return format!("Redis({cause})");
    }
    let text = format!("{err:?}");
    text.split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A client of `deployment` by `connect_sentinel` (every Sentinel's URL and the master's name),
/// with `options`.
pub(super) async fn connect_sentinel(
    deployment: &RedisSentinels,
    options: RedsemOptions,
) -> Redsem {
    let urls = deployment.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    within(
        LIMIT,
        "connect_sentinel",
        Redsem::connect_sentinel_with(&urls, deployment.master_name(), options),
    )
    .await
    .expect("connect_sentinel")
}
