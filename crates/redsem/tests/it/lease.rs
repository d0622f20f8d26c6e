//! Lease semaphore behaviour through the public API: the non-waiting half, leases, loss.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Poll;
use std::time::Duration;

use redis::AsyncCommands;
use redsem::{Error, LeaseOptions, Redsem, RedsemOptions};
use tokio::time::Instant;

use crate::support::*;

/// How late a timer may fire on a busy 2-core machine before a test calls it a failure.
const SCHEDULING_SLACK: Duration = Duration::from_millis(100);

both_topologies!(
    never_more_than_capacity_holders_with_32_tasks_over_two_clients,
    multi_thread
);
async fn never_more_than_capacity_holders_with_32_tasks_over_two_clients(
    ctx: &TestContext<Topology>,
) {
    let clients = [ctx.redsem.clone(), ctx.client().await];
    const CAPACITY: u32 = 3;
    let live = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..32 {
        let sem = clients[t % 2]
            .lease_semaphore_with("stress", CAPACITY, short(2_000))
            .expect("semaphore");
        let (live, peak, grants) = (live.clone(), peak.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let permit = sem.acquire().await.expect("acquire");
                let now = live.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                grants
                    .lock()
                    .expect("grants")
                    .push((permit.token().get(), permit.slot()));
                let slot = permit.slot();
                assert!(slot < CAPACITY, "slot {slot}");
                tokio::task::yield_now().await;
                live.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        within(LIMIT * 3, "stress task", task)
            .await
            .expect("task did not panic");
    }
    assert!(peak.load(Ordering::SeqCst) <= CAPACITY, "peak {peak:?}");
    assert_eq!(
        peak.load(Ordering::SeqCst),
        CAPACITY,
        "the capacity was used"
    );
    let grants = grants.lock().expect("grants");
    let tokens: HashSet<u64> = grants.iter().map(|g| g.0).collect();
    assert_eq!(tokens.len(), 32 * 5, "every grant has its own token");
}

both_topologies!(tokens_strictly_increase_and_live_slots_are_distinct);
async fn tokens_strictly_increase_and_live_slots_are_distinct(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("s", 4).expect("semaphore");
    let mut last = 0;
    let mut held = Vec::new();
    for round in 0..20 {
        let permit = within(LIMIT, "try_acquire", sem.try_acquire())
            .await
            .expect("a unit is free");
        assert!(permit.token().get() > last, "round {round}");
        last = permit.token().get();
        held.push(permit);
        let slots: HashSet<u32> = held.iter().map(|p| p.slot()).collect();
        assert_eq!(slots.len(), held.len(), "distinct slots");
        assert!(slots.iter().all(|s| *s < 4));
        if held.len() == 4 {
            // Release a middle one: its slot is the one handed out next.
            let freed = held.remove(1);
            let slot = freed.slot();
            freed.release().await.expect("release");
            let next = sem.try_acquire().await.expect("free again");
            assert_eq!(next.slot(), slot);
            last = next.token().get();
            held.push(next);
            for p in held.drain(..) {
                p.release().await.expect("release");
            }
        }
    }
}

both_topologies!(try_acquire_reports_no_permit_with_the_numbers);
async fn try_acquire_reports_no_permit_with_the_numbers(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("s", 1).expect("semaphore");
    let _held = sem.try_acquire().await.expect("first");
    match sem.try_acquire().await {
        Err(Error::NoPermit {
            capacity: 1,
            in_use: 1,
            waiters: 0,
            ..
        }) => {}
        other => panic!("expected NoPermit, got {other:?}"),
    }
}

both_topologies!(a_crashed_holder_is_reclaimed_within_the_lease);
async fn a_crashed_holder_is_reclaimed_within_the_lease(ctx: &TestContext<Topology>) {
    let lease = Duration::from_millis(400);
    {
        let doomed = ctx.client().await;
        let sem = doomed
            .lease_semaphore_with("s", 1, short(400))
            .expect("semaphore");
        let permit = sem.try_acquire().await.expect("acquire");
        // Neither released nor renewed: as if the process died.
        permit.forget();
    }
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, short(400))
        .expect("semaphore");
    let started = Instant::now();
    assert!(sem.try_acquire().await.is_err(), "still held at first");
    let permit = within(LIMIT, "reclaim", sem.acquire())
        .await
        .expect("acquired after the lease ended");
    let took = started.elapsed();
    assert!(took <= lease + Duration::from_millis(300), "took {took:?}");
    permit.release().await.expect("release");
}

both_topologies!(keepalive_keeps_a_permit_for_many_leases);
async fn keepalive_keeps_a_permit_for_many_leases(ctx: &TestContext<Topology>) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, short(150))
        .expect("semaphore");
    let permit = sem.try_acquire().await.expect("acquire");
    tokio::select! {
        () = permit.lost() => panic!("lost while renewed"),
        () = tokio::time::sleep(Duration::from_millis(1_000)) => {}
    }
    assert!(permit.is_held());
    assert!(sem.try_acquire().await.is_err(), "still held on the server");
    permit.release().await.expect("release");
}

both_topologies!(lost_fires_before_the_lease_ends_when_renewals_stop);
async fn lost_fires_before_the_lease_ends_when_renewals_stop(ctx: &TestContext<Topology>) {
    let options = short(300).keepalive(false);
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, options)
        .expect("semaphore");
    let sent = Instant::now();
    let permit = sem.try_acquire().await.expect("acquire");
    within(LIMIT, "lost", permit.lost()).await;
    let fired = Instant::now();
    // The timer is set for exactly the lease; allow the scheduler of a loaded CI machine.
    assert!(fired <= sent + Duration::from_millis(300) + SCHEDULING_SLACK);
    assert!(fired >= sent + Duration::from_millis(250), "not too early");
    assert!(!permit.is_held());
    // The server agrees within a moment: another client gets the unit.
    let other = within(LIMIT, "acquire after loss", sem.acquire())
        .await
        .expect("acquire");
    other.release().await.expect("release");
}

#[tokio::test]
async fn lost_fires_before_the_lease_ends_when_the_server_stalls() {
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, short(300))
        .expect("semaphore");
    let sent = Instant::now();
    let permit = sem.try_acquire().await.expect("acquire");
    // Freeze the server for longer than the lease.
    let mut conn = ctx.server.connection();
    let sleeper = std::thread::spawn(move || {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1")
            .query::<()>(&mut conn)
            .expect("DEBUG SLEEP");
    });
    within(
        Duration::from_secs(2),
        "lost during the stall",
        permit.lost(),
    )
    .await;
    let fired = Instant::now();
    assert!(
        fired <= sent + Duration::from_millis(300) + SCHEDULING_SLACK,
        "lost {:?} after the grant was sent",
        fired - sent
    );
    assert!(!permit.is_held());
    sleeper.join().expect("DEBUG SLEEP returned");
    match permit.refresh().await {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("refresh after loss: {other:?}"),
    }
}

both_topologies!(refresh_release_and_not_held);
async fn refresh_release_and_not_held(ctx: &TestContext<Topology>) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 2, short(5_000))
        .expect("semaphore");
    let asked = tokio::time::Instant::now();
    let permit = sem.try_acquire().await.expect("acquire");
    let before = permit.expires_at();
    // Within the lease asked for, counted from the request, and well ahead of now (the
    // instant, not one as far in the past: cargo-mutants' `+` → `-` in `expires_at`).
    assert!(before <= asked + Duration::from_millis(5_000), "{before:?}");
    assert!(
        before > tokio::time::Instant::now() + Duration::from_millis(4_000),
        "{before:?}"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    permit.refresh().await.expect("refresh");
    assert!(permit.expires_at() > before);
    let id = permit.id().clone();
    permit.release().await.expect("release");
    // Releasing it again by id is another call: the permit is not held. (The same release
    // resent answers as the first one did: `lease_faults`, `release_faults`.)
    match sem.release_id(&id).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("a release by id after the release: {other:?}"),
    }
    let unknown = redsem::PermitId::new("0123456789abcdef0123456789abcdef");
    match sem.release_id(&unknown).await {
        Err(Error::NotHeld { id: got, .. }) => assert_eq!(got, unknown.to_string()),
        other => panic!("release of an unknown id: {other:?}"),
    }
    match sem.refresh_id(&id, Duration::from_secs(1)).await {
        Err(e) if e.is_not_held() => {}
        other => panic!("refresh after release: {other:?}"),
    }
}

both_topologies!(forget_leaves_the_permit_until_its_lease_ends_and_by_id_ops_work);
async fn forget_leaves_the_permit_until_its_lease_ends_and_by_id_ops_work(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, short(300))
        .expect("semaphore");
    let permit = sem.try_acquire().await.expect("acquire");
    let id = permit.id().clone();
    permit.forget();
    sem.refresh_id(&id, Duration::from_secs(5))
        .await
        .expect("refresh by id");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(sem.try_acquire().await.is_err(), "refreshed by id: held");
    sem.release_id(&id).await.expect("release by id");
    cycle(&sem).await.expect("free after release by id");
}

both_topologies!(dropping_a_permit_releases_it);
async fn dropping_a_permit_releases_it(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("s", 1).expect("semaphore");
    let first = sem.try_acquire().await.expect("acquire");
    let token = first.token();
    drop(first);
    within(LIMIT, "flush", ctx.redsem.flush()).await;
    assert_eq!(
        sem.status().await.expect("status").in_use,
        0,
        "released by flush time"
    );
    let again = within(LIMIT, "acquire after drop", sem.acquire())
        .await
        .expect("acquire");
    assert!(again.token() > token);
    again.release().await.expect("release");
}

both_topologies!(
    a_permit_released_through_a_shared_reference_by_two_tasks_at_once_is_released_once,
    multi_thread,
    node_wide
);
async fn a_permit_released_through_a_shared_reference_by_two_tasks_at_once_is_released_once(
    ctx: &TestContext<Topology>,
) {
    if skip_without(
        Needs::Functions,
        "a_permit_released_through_a_shared_reference_by_two_tasks_at_once_is_released_once",
        "counts calls as one FCALL each (by EVALSHA a script's first call meets NOSCRIPT and is sent again)",
    ) {
        return;
    }
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, LeaseOptions::default().keepalive(false))
        .expect("semaphore");
    let permit = Arc::new(sem.try_acquire().await.expect("acquire"));
    ctx.reset_stats().await;
    let start = Arc::new(tokio::sync::Barrier::new(2));
    let releases: Vec<_> = (0..2)
        .map(|_| {
            let (permit, start) = (permit.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                permit.release_shared().await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for release in releases {
        answers.push(within(LIMIT, "a release", release).await.expect("no panic"));
    }
    let released = answers.iter().filter(|a| a.is_ok()).count();
    let not_held = answers
        .iter()
        .filter(|a| matches!(a, Err(Error::NotHeld { .. })))
        .count();
    assert_eq!((released, not_held), (1, 1), "{answers:?}");
    assert_eq!(ctx.script_calls().await, 1, "one release reached Redis");
    // Both answered: the release is done, whichever answered first.
    assert_eq!(sem.status().await.expect("status").in_use, 0);
    assert!(!permit.is_held() && permit.is_lost());
    within(LIMIT, "lost() of a released permit", permit.lost()).await;
    // (The idle semaphore's tidy-up goes now, not in the middle of the count below.)
    within(LIMIT, "flush", ctx.redsem.flush()).await;
    ctx.reset_stats().await;
    // Later calls answer as a released permit does, without a round trip.
    match permit.release_shared().await {
        Err(Error::NotHeld { id, .. }) => assert_eq!(id, permit.id().to_string()),
        other => panic!("a release after the release: {other:?}"),
    }
    match permit.refresh().await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("a refresh after the release: {other:?}"),
    }
    // The last handle dropped: nothing more to release.
    drop(Arc::into_inner(permit).expect("the last handle"));
    within(LIMIT, "flush", ctx.redsem.flush()).await;
    assert_eq!(
        ctx.script_calls().await,
        0,
        "nothing sent after the release"
    );
    cycle(&sem).await.expect("the unit is free");
}

both_topologies!(a_release_through_a_shared_reference_dropped_half_way_still_happens);
async fn a_release_through_a_shared_reference_dropped_half_way_still_happens(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx.redsem.lease_semaphore("s", 1).expect("semaphore");
    let permit = sem.try_acquire().await.expect("acquire");
    {
        // Polled once, then dropped: the release goes on in the background.
        let mut first = std::pin::pin!(permit.release_shared());
        let polled = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
        assert!(
            polled.is_pending(),
            "the first release answered on its first poll"
        );
    }
    // A later call waits for that release to end, then answers as a released permit does.
    match within(LIMIT, "the second release", permit.release_shared()).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("a release after the first: {other:?}"),
    }
    assert_eq!(sem.status().await.expect("status").in_use, 0, "released");
    drop(permit);
    cycle(&sem).await.expect("the unit is free");
}

both_topologies!(status_shows_holders_with_labels_tokens_slots_and_time_left);
async fn status_shows_holders_with_labels_tokens_slots_and_time_left(ctx: &TestContext<Topology>) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 3, LeaseOptions::default().label("host-1"))
        .expect("semaphore");
    let a = sem.try_acquire().await.expect("a");
    let b = sem.try_acquire_many(2).await.expect("b");
    let status = sem.status().await.expect("status");
    assert_eq!(status.capacity, Some(3));
    assert_eq!(status.in_use, 3);
    assert_eq!(status.holders.len(), 2);
    assert_eq!(status.holders[0].id, *a.id());
    assert_eq!(status.holders[0].token, a.token());
    assert_eq!(status.holders[0].label.as_deref(), Some("host-1"));
    assert_eq!(status.holders[1].slots, b.slots());
    assert!(status.holders[0].expires_in > Duration::from_secs(29));
    // The soonest of the two ends, both granted just now with the default 30 s lease.
    let next = status
        .next_lease_end()
        .expect("holders, so a next lease end");
    assert_eq!(
        Some(next),
        status.holders.iter().map(|h| h.expires_in).min(),
        "the soonest end"
    );
    assert!(next > Duration::from_secs(29), "{next:?}");
    assert!(status.waiters.is_empty());
    assert_eq!(
        ctx.redsem.lease_semaphore_names().await.expect("names"),
        vec!["s".to_owned()]
    );
}

both_topologies!(one_permit_per_label_gives_already_held);
async fn one_permit_per_label_gives_already_held(ctx: &TestContext<Topology>) {
    let options = LeaseOptions::default()
        .label("10.1.2.3")
        .one_per_label(true);
    let sem = ctx
        .redsem
        .lease_semaphore_with("jobs", 3, options.clone())
        .expect("semaphore");
    let first = sem.try_acquire().await.expect("first");
    for result in [sem.try_acquire().await, sem.acquire().await] {
        match result {
            Err(Error::AlreadyHeld { label, .. }) => assert_eq!(label, "10.1.2.3"),
            other => panic!("expected AlreadyHeld, got {other:?}"),
        }
    }
    first.release().await.expect("release");
    cycle(&sem).await.expect("free for the label again");
}

both_topologies!(a_different_capacity_while_in_use_is_a_conflict_naming_both);
async fn a_different_capacity_while_in_use_is_a_conflict_naming_both(ctx: &TestContext<Topology>) {
    let two = ctx.redsem.lease_semaphore("s", 2).expect("semaphore");
    let three = ctx.redsem.lease_semaphore("s", 3).expect("semaphore");
    let held = two.try_acquire().await.expect("acquire");
    let err = three.try_acquire().await.expect_err("conflict");
    assert!(
        matches!(
            err,
            Error::CapacityConflict {
                requested: 3,
                current: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains('3') && err.to_string().contains('2'));
    assert!(matches!(
        three.acquire().await,
        Err(Error::CapacityConflict { .. })
    ));
    // An explicit change is allowed and never revokes the live permit.
    assert_eq!(three.set_capacity(3).await.expect("set"), Some(2));
    assert!(held.is_held());
    let more = three.try_acquire_many(2).await.expect("room for two more");
    held.release().await.expect("release");
    more.release().await.expect("release");
}

async fn dump_all(ctx: &TestContext<Topology>) -> Vec<(String, Vec<u8>)> {
    let mut conn = ctx.raw().await;
    let mut out = Vec::new();
    for key in ctx.keys().await {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("DUMP");
        out.push((key, dump));
    }
    out
}

both_topologies!(bad_input_gets_typed_errors_and_leaves_state_untouched);
async fn bad_input_gets_typed_errors_and_leaves_state_untouched(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("s", 2).expect("semaphore");
    let held = sem.try_acquire().await.expect("acquire");
    let before = dump_all(ctx).await;

    let r = &ctx.redsem;
    let invalid = |e: Error| assert!(e.is_invalid_argument(), "{e:?}");
    invalid(r.lease_semaphore("", 1).expect_err("empty name"));
    invalid(r.lease_semaphore("s", 0).expect_err("capacity 0"));
    invalid(
        r.lease_semaphore_with("s", 1, short(5))
            .expect_err("lease too short"),
    );
    invalid(
        r.lease_semaphore_with("s", 1, LeaseOptions::default().lease(Duration::ZERO))
            .expect_err("lease 0"),
    );
    invalid(
        r.lease_semaphore_with("s", 1, LeaseOptions::default().label(""))
            .expect_err("empty label"),
    );
    invalid(sem.try_acquire_many(0).await.expect_err("0 units"));
    invalid(sem.try_acquire_many(3).await.expect_err("3 units of 2"));
    invalid(sem.acquire_many(3).await.expect_err("3 units of 2"));
    invalid(sem.set_capacity(0).await.expect_err("capacity 0"));
    invalid(
        sem.refresh_id(held.id(), Duration::ZERO)
            .await
            .expect_err("lease 0"),
    );
    invalid(
        ctx.connect_with(RedsemOptions::default().prefix(""))
            .await
            .expect_err("empty prefix"),
    );
    invalid(Redsem::connect("not a url").await.expect_err("bad url"));

    assert_eq!(dump_all(ctx).await, before, "stored state untouched");
    held.release().await.expect("release");
}

both_topologies!(a_foreign_key_gives_wrong_type_and_is_not_overwritten);
async fn a_foreign_key_gives_wrong_type_and_is_not_overwritten(ctx: &TestContext<Topology>) {
    let leases = format!("{}:{{lease:s}}:leases", ctx.prefix);
    let mut conn = ctx.raw().await;
    let _: () = conn.set(&leases, "not ours").await.expect("set");
    let sem = ctx.redsem.lease_semaphore("s", 2).expect("semaphore");
    match sem.try_acquire().await {
        Err(Error::WrongType { key, actual, .. }) => {
            assert_eq!(key, leases);
            assert_eq!(actual, "string");
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    assert!(matches!(sem.status().await, Err(Error::WrongType { .. })));
    let value: String = conn.get(&leases).await.expect("get");
    assert_eq!(value, "not ours");
    assert_eq!(ctx.keys().await, vec![leases]);
}

#[tokio::test]
async fn scripts_reload_after_script_flush_and_after_a_restart() {
    let mut ctx = TestContext::start().await;
    let sem = ctx.redsem.lease_semaphore("s", 1).expect("semaphore");
    let first = sem.try_acquire().await.expect("first");
    let token = first.token();
    first.release().await.expect("release");
    let mut conn = ctx.raw().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("flush");
    cycle(&sem).await.expect("after SCRIPT FLUSH");

    ctx.server.restart();
    // The first command after a restart may see the dropped connection; the manager reconnects.
    let deadline = Instant::now() + LIMIT;
    let permit = loop {
        match sem.try_acquire().await {
            Ok(permit) => break permit,
            Err(e) if e.is_unavailable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("after restart: {e:?}"),
        }
    };
    assert!(
        permit.token() > token,
        "tokens keep increasing on a server that lost everything"
    );
    permit.release().await.expect("release");
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let err = Redsem::connect(&url).await.expect_err("nobody listens");
    assert!(err.is_unavailable(), "{err:?}");
}

both_topologies!(
    one_round_trip_per_try_acquire_refresh_and_release,
    node_wide
);
async fn one_round_trip_per_try_acquire_refresh_and_release(ctx: &TestContext<Topology>) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, LeaseOptions::default().keepalive(false))
        .expect("semaphore");
    // Load the scripts first, so NOSCRIPT reloads don't count.
    let warm = sem.try_acquire().await.expect("warm");
    warm.refresh().await.expect("warm refresh");
    warm.release().await.expect("warm release");
    ctx.reset_stats().await;
    // Commands run inside a script are counted too, so count what only a client sends.
    let measure = async |what: &str| {
        let stats = ctx.command_stats().await;
        ctx.reset_stats().await;
        let calls = |name: &str| stats.get(name).copied().unwrap_or(0);
        // Sent by clients: the calls, and the connections and questions of the inspection.
        let sent = [
            "fcall", "evalsha", "eval", "script", "function", "info", "config", "client", "hello",
            "cluster", "ping",
        ];
        let inside: u64 = stats
            .iter()
            .filter(|(name, _)| !sent.contains(&name.split('|').next().unwrap_or(name)))
            .map(|(_, calls)| calls)
            .sum();
        println!(
            "{what}: {} FCALL round trip(s); the function ran {inside} commands inside",
            calls("fcall")
        );
        (
            calls("fcall") + calls("evalsha"),
            calls("eval") + calls("script") + calls("function|load"),
        )
    };
    let permit = sem.try_acquire().await.expect("acquire");
    assert_eq!(measure("try_acquire").await, (1, 0));
    permit.refresh().await.expect("refresh");
    assert_eq!(measure("refresh").await, (1, 0));
    permit.release().await.expect("release");
    assert_eq!(measure("release").await, (1, 0));
}

#[tokio::test]
async fn a_hundred_permits_with_keepalive_share_one_connection() {
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 100, short(300))
        .expect("semaphore");
    let mut permits = Vec::new();
    for _ in 0..100 {
        permits.push(sem.try_acquire().await.expect("acquire"));
    }
    // Several renewal rounds.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(permits.iter().all(|p| p.is_held()));
    // Our client's one command connection, plus the raw one used to ask.
    let normal = ctx.clients_of_type("normal").await;
    let pubsub = ctx.clients_of_type("pubsub").await;
    println!(
        "100 permits with keepalive: {normal} normal connections (one is the inspector), {pubsub} pub/sub"
    );
    assert_eq!(normal, 2);
    assert_eq!(pubsub, 0, "nothing waited, so no pub/sub connection");
    for p in permits {
        p.release().await.expect("release");
    }
}

#[tokio::test]
async fn connects_over_tls_with_a_given_root_certificate() {
    if skip_without(
        Needs::Tls,
        "connects_over_tls_with_a_given_root_certificate",
        "starts a TLS server",
    ) {
        return;
    }
    let tls = redsem_test::TlsRedisServer::start();
    let options = RedsemOptions::default().tls_root_cert(tls.ca_cert());
    let redsem = within(
        LIMIT,
        "TLS connect",
        Redsem::connect_with(&tls.tls_url(), options),
    )
    .await
    .expect("connect over TLS");
    let sem = redsem.lease_semaphore("tls", 1).expect("semaphore");
    let permit = sem.acquire().await.expect("acquire over TLS");
    assert!(permit.token().get() > 0);
    permit.release().await.expect("release");

    // Without trusting the certificate, the connection is refused.
    let err = Redsem::connect(&tls.tls_url())
        .await
        .expect_err("an untrusted self-signed certificate");
    assert!(!err.is_invalid_argument(), "{err:?}");
}

#[tokio::test]
async fn connects_with_a_password_a_user_and_a_database_number() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query(&mut admin)
        .expect("requirepass");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("jobs")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut admin)
        .expect("ACL SETUSER");
    let port = server.port();
    for url in [
        format!("redis://:s3cret@127.0.0.1:{port}/3"),
        format!("redis://jobs:pw@127.0.0.1:{port}/3"),
    ] {
        let redsem = within(LIMIT, "connect", Redsem::connect(&url))
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let sem = redsem.lease_semaphore("db3", 1).expect("semaphore");
        cycle(&sem).await.expect("acquire and release");
    }
    let _: () = redis::cmd("SELECT")
        .arg(3)
        .query(&mut admin)
        .expect("select");
    let state: bool = redis::cmd("EXISTS")
        .arg("redsem:{lease:db3}:state")
        .query(&mut admin)
        .expect("exists");
    assert!(state, "the state lives in database 3");
    let wrong = Redsem::connect(&format!("redis://:nope@127.0.0.1:{port}/"))
        .await
        .expect_err("a wrong password");
    assert!(!wrong.is_invalid_argument(), "{wrong:?}");
}
