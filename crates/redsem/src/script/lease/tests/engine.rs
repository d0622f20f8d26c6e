//! Which engine the script tests' calls reach: the Lua library, or with `REDSEM_TEST_MODULE`
//! set the module's commands (see `test_support`), as the server counts them.

use super::support::*;
use crate::keys::{LatchKeys, PermitKeys};
use crate::script::{latch_try_set, permit_try_set};
use crate::session::Caller;

/// `calls=` of each `cmdstat_<command>` line of `INFO commandstats`, by command.
async fn calls_by_command(conn: &mut Conn) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

#[tokio::test]
async fn the_operations_reach_the_engine_under_test() {
    // Every way the tests call an operation: a typed wrapper, a raw call, a call in a MULTI,
    // on each primitive. With the module loaded, the server counts each as a REDSEM.<OP>
    // command of its own; without it, as FCALL (the wrappers, the MULTI) and EVALSHA (raw).
    let (_server, mut conn, _) = start().await;
    // Warm up: the library and the raw script loaded.
    granted(acquire(&mut conn, req("warm", 8, 1, false)).await);
    granted(raw_acquire(&mut conn, "raw warm", 8, 1, "warm", 1).await);
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("RESETSTAT");

    granted(acquire(&mut conn, req("typed", 8, 1, false)).await);
    granted(raw_acquire(&mut conn, "raw", 8, 2, "warm", 1).await);
    let (reply,): (Value,) = within(
        LIMIT,
        "MULTI",
        redis::pipe()
            .atomic()
            .add_command(multi_try_acquire(&req("multi", 8, 1, false)))
            .query_async(&mut conn),
    )
    .await
    .expect("MULTI");
    granted(decode_acquire("lease_acquire", reply).expect("decode"));
    let set = Caller::new(session(), number("engine set"));
    assert!(
        permit_try_set(&mut conn, &PermitKeys::new("t", "p"), "s", 1, set)
            .await
            .expect("permit_try_set")
    );
    assert!(
        latch_try_set(&mut conn, &LatchKeys::new("t", "l"), 1, set)
            .await
            .expect("latch_try_set")
    );

    let calls = calls_by_command(&mut conn).await;
    let of = |name: &str| calls.iter().find(|(n, _)| n == name).map_or(0, |&(_, c)| c);
    let native: Vec<&(String, u64)> = calls
        .iter()
        .filter(|(n, _)| n.starts_with("redsem."))
        .collect();
    if conn.is_native() {
        println!("module commands run: {native:?}");
        assert_eq!(of("redsem.lease_acquire"), 3, "{calls:?}");
        assert_eq!(of("redsem.permit_try_set"), 1, "{calls:?}");
        assert_eq!(of("redsem.latch_try_set"), 1, "{calls:?}");
        assert_eq!(of("evalsha"), 0, "no script run by the test: {calls:?}");
    } else {
        assert!(native.is_empty(), "no module command: {calls:?}");
        assert_eq!(of("fcall"), 4, "{calls:?}");
        assert_eq!(of("evalsha"), 1, "{calls:?}");
    }
}
