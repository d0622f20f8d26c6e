//! The scripts as a Redis Functions library: loaded once per server (and again after it lost
//! it), side by side with other versions, and EVALSHA where functions are refused.

use crate::support::{LIMIT, TestContext, connect_url, cycle, no_functions_user, within};
use crate::support::{Needs, skip_without};

/// The libraries on the server whose name starts with `redsem_`.
async fn redsem_libraries(ctx: &TestContext) -> Vec<String> {
    let mut conn = ctx.raw().await;
    let list: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("FUNCTION LIST");
    let text = format!("{list:?}");
    let mut names: Vec<String> = text
        .split('"')
        .filter(|s| s.starts_with("redsem_") && s.len() == "redsem_".len() + 12)
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[tokio::test]
async fn operations_run_as_functions_of_one_library_loaded_once() {
    if skip_without(
        Needs::Functions,
        "operations_run_as_functions_of_one_library_loaded_once",
        "loads, lists, flushes or refuses (-fcall) the function library itself",
    ) {
        return;
    }
    let ctx = TestContext::start().await;
    ctx.reset_stats().await;
    let sem = ctx.redsem.lease_semaphore("f", 2).expect("semaphore");
    for _ in 0..5 {
        cycle(&sem).await.expect("acquire and release");
    }
    let latch = ctx.redsem.count_down_latch("f").expect("latch");
    latch.try_set_count(1).await.expect("set");
    latch.count_down().await.expect("count down");
    let permits = ctx.redsem.permit_semaphore("f").expect("permits");
    permits.add_permits(1).await.expect("add");
    assert_eq!(redsem_libraries(&ctx).await.len(), 1);
    assert_eq!(ctx.command_calls("function|load").await, 1, "loaded once");
    assert!(ctx.command_calls("fcall").await >= 13);
    assert_eq!(ctx.command_calls("evalsha").await, 0);
}

#[tokio::test]
async fn a_server_that_lost_the_library_gets_it_again() {
    if skip_without(
        Needs::Functions,
        "a_server_that_lost_the_library_gets_it_again",
        "loads, lists, flushes or refuses (-fcall) the function library itself",
    ) {
        return;
    }
    let ctx = TestContext::start().await;
    let sem = ctx.redsem.lease_semaphore("f", 1).expect("semaphore");
    cycle(&sem).await.expect("acquire and release");
    let mut conn = ctx.raw().await;
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("FUNCTION FLUSH");
    assert!(redsem_libraries(&ctx).await.is_empty());
    cycle(&sem).await.expect("after FUNCTION FLUSH");
    assert_eq!(redsem_libraries(&ctx).await.len(), 1);
}

#[tokio::test]
async fn another_version_of_the_library_beside_it_changes_nothing() {
    if skip_without(
        Needs::Functions,
        "another_version_of_the_library_beside_it_changes_nothing",
        "loads, lists, flushes or refuses (-fcall) the function library itself",
    ) {
        return;
    }
    let ctx = TestContext::start().await;
    let mut conn = ctx.raw().await;
    // What an older (or newer) client would have loaded: its own library and functions.
    let other = "#!lua name=redsem_000000000000\n\
        redis.register_function('redsem_000000000000_lease_acquire', \
        function(keys, args) return redis.error_reply('the other version ran') end)";
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(other)
        .query_async(&mut conn)
        .await
        .expect("load the other version");
    let sem = ctx.redsem.lease_semaphore("f", 1).expect("semaphore");
    cycle(&sem).await.expect("our own version ran");
    assert_eq!(redsem_libraries(&ctx).await.len(), 2, "side by side");
    // And the other one is still there, untouched.
    let answer: redis::RedisResult<String> = redis::cmd("FCALL")
        .arg("redsem_000000000000_lease_acquire")
        .arg(0)
        .query_async(&mut conn)
        .await;
    assert!(
        format!("{answer:?}").contains("other version ran"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_user_refused_functions_runs_the_same_operations_by_evalsha() {
    if skip_without(
        Needs::Functions,
        "a_user_refused_functions_runs_the_same_operations_by_evalsha",
        "loads, lists, flushes or refuses (-fcall) the function library itself",
    ) {
        return;
    }
    let ctx = TestContext::start().await;
    let mut conn = ctx.raw().await;
    let () = no_functions_user()
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://nofunc:pw@127.0.0.1:{}/", ctx.server.port());
    let redsem = connect_url(&url).await;
    ctx.reset_stats().await;
    let sem = redsem.lease_semaphore("f", 1).expect("semaphore");
    for _ in 0..3 {
        cycle(&sem).await.expect("acquire and release");
    }
    let waiter = {
        let sem = sem.clone();
        let held = sem.try_acquire().await.expect("hold");
        let task = tokio::spawn(async move { sem.acquire().await });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        held.release().await.expect("release");
        task
    };
    let _granted = within(LIMIT, "the waiter", waiter)
        .await
        .expect("task")
        .expect("granted");
    assert!(ctx.command_calls("evalsha").await >= 8);
    // Refused once, then remembered for this client: no FCALL attempt per call.
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let fcall_line = info.lines().find(|l| l.starts_with("cmdstat_fcall:"));
    let rejected = fcall_line
        .and_then(|l| l.split("rejected_calls=").nth(1))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(rejected <= 1, "{fcall_line:?}");
    assert!(redsem_libraries(&ctx).await.is_empty());

    // The group commits' scripts by EVALSHA too: 16 concurrent tries share calls, each with
    // the outcome it would have had alone.
    let pool = redsem.permit_semaphore("g").expect("handle");
    assert!(pool.try_set_permits(4).await.expect("set"));
    let wide = redsem.lease_semaphore("g", 4).expect("semaphore");
    drop(wide.status().await.expect("status"));
    ctx.reset_stats().await;
    let permit_tries: Vec<_> = (0..16)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.try_acquire(1).await.is_ok() })
        })
        .collect();
    let lease_tries: Vec<_> = (0..16)
        .map(|_| {
            let wide = wide.clone();
            tokio::spawn(async move { wide.try_acquire().await.ok() })
        })
        .collect();
    let mut taken = 0;
    for t in permit_tries {
        taken += usize::from(within(LIMIT, "permit try", t).await.expect("task"));
    }
    let mut held = Vec::new();
    for t in lease_tries {
        held.extend(within(LIMIT, "lease try", t).await.expect("task"));
    }
    assert_eq!((taken, held.len()), (4, 4));
    let calls = ctx.command_calls("evalsha").await;
    assert!(
        calls < 32,
        "32 tries in {calls} EVALSHA calls: none shared one"
    );
}
