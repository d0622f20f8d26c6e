//! The waiters stay counted: a waiter dropped at the end of its lease leaves the others
//! counted in the records (wlen), as many as the waiters zset holds.

use std::time::Duration;

use redis::AsyncCommands;
use redsem_test::RedisServer;

use super::{LONG, acquire, available, connect, pk};
use crate::script::permit::PermitAcquire;

#[tokio::test]
async fn a_waiter_dropped_at_the_end_of_its_lease_leaves_the_others_counted() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let short = Duration::from_millis(100);
    for (id, lease) in [("dead", short), ("alive", LONG)] {
        assert!(matches!(
            acquire(&mut conn, id, 1, true, lease).await,
            PermitAcquire::Queued { .. }
        ));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(available(&mut conn).await, 0);
    let k = pk();
    let waiting: u64 = conn.zcard(&k.all[2]).await.expect("zcard");
    let counted: String = conn.hget(&k.all[3], "wlen").await.expect("hget");
    assert_eq!((waiting, counted.as_str()), (1, "1"));
}
