//! Grants: fencing tokens, the slots a grant takes (the lowest free ones, holes first, runs
//! recorded), requests refused before any work, and the scripts on a cluster.

use super::support::*;

#[tokio::test]
async fn acquire_grants_tokens_and_lowest_free_slots_then_reports_busy() {
    let (_server, mut conn, _) = start().await;
    let before = server_micros(&mut conn).await;
    let (a, slots) = granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    assert_eq!(slots, vec![0]);
    // Tokens are seeded from the server clock in microseconds (exact below 2^53).
    assert!(a >= before && a < 1 << 53, "{before} {a}");
    let (b, slots) = granted(acquire(&mut conn, req("b", 2, 1, false)).await);
    assert_eq!(slots, vec![1]);
    assert!(b > a);
    assert_eq!(
        acquire(&mut conn, req("c", 2, 1, false)).await,
        Acquire::Busy {
            in_use: 2,
            waiters: 0
        }
    );
    // Releasing slot 0 makes it the next one handed out.
    assert_eq!(
        release(&mut conn, &keys(), "a").await.expect("release"),
        Release::Released
    );
    let (d, slots) = granted(acquire(&mut conn, req("d", 2, 1, false)).await);
    assert_eq!(slots, vec![0]);
    assert!(d > b);
}

#[tokio::test]
async fn scripts_run_on_a_three_master_cluster() {
    let cluster = start_cluster(3);
    let mut conn = connect_cluster(&cluster).await;
    for name in ["a", "b", "c", "d", "e", "f"] {
        let k = LeaseKeys::new("t", name);
        let r = req("x", 2, 1, true);
        let reply = within(LIMIT, "acquire", lease_acquire(&mut conn, &k, &r))
            .await
            .expect("acquire on the cluster");
        let (first, _) = granted(reply);
        let mut r2 = r;
        r2.id = "y";
        lease_acquire(&mut conn, &k, &r2).await.expect("second");
        r2.id = "z";
        assert!(matches!(
            lease_acquire(&mut conn, &k, &r2).await.expect("third"),
            Acquire::Queued { .. }
        ));
        assert_eq!(
            release(&mut conn, &k, "x").await.expect("release"),
            Release::Released
        );
        let (third, _) = granted(
            lease_poll(
                &mut conn,
                &k,
                "z",
                Duration::from_secs(5),
                Duration::from_secs(5),
            )
            .await
            .expect("poll"),
        );
        assert!(third > first);
        let status = lease_status(&mut conn, &k).await.expect("status");
        assert_eq!(status.holders.len(), 2);
    }
}

#[tokio::test]
async fn a_huge_request_is_refused_before_any_work() {
    // A grant once looped per unit, quadratically: 10^6 units blocked Redis 7.8 s.
    let (_server, mut conn, _) = start().await;
    assert_eq!(
        acquire(&mut conn, req("a", u32::MAX, 1_000_000, false)).await,
        Acquire::TooMany {
            most: MAX_UNITS_FOR_TESTS
        }
    );
    let (_, slots) =
        granted(acquire(&mut conn, req("b", u32::MAX, MAX_UNITS_FOR_TESTS, false)).await);
    assert_eq!(slots.len(), MAX_UNITS_FOR_TESTS as usize);
    let (_, slots) =
        granted(acquire(&mut conn, req("c", u32::MAX, MAX_UNITS_FOR_TESTS, false)).await);
    assert_eq!(slots[0], MAX_UNITS_FOR_TESTS);
    assert_eq!(slots.len(), MAX_UNITS_FOR_TESTS as usize);
}

#[tokio::test]
async fn a_grant_fills_holes_first_then_takes_one_run_and_records_runs() {
    let (_server, mut conn, k) = start().await;
    for id in ["a", "b", "c"] {
        granted(acquire(&mut conn, req(id, 20, 3, false)).await);
    }
    release(&mut conn, &k, "b").await.expect("release");
    let (_, slots) = granted(acquire(&mut conn, req("d", 20, 5, false)).await);
    assert_eq!(slots, vec![3, 4, 5, 9, 10]);
    let record: String = conn.hget(&k.state, "r:d").await.expect("hget");
    assert!(record.contains("|3-5,9-10|"), "{record}");
    let bits: u32 = redis::cmd("BITCOUNT")
        .arg(&k.slots)
        .query_async(&mut conn)
        .await
        .expect("bitcount");
    assert_eq!(bits, 11);
    release(&mut conn, &k, "d").await.expect("release");
    let (_, slots) = granted(acquire(&mut conn, req("e", 20, 1, false)).await);
    assert_eq!(slots, vec![3], "the runs of d were cleared");
}

#[tokio::test]
async fn an_acquire_with_a_count_that_is_not_a_number_is_refused() {
    let (_server, mut conn, k) = start().await;
    let good = ["id", "2", "1", "1000", "", "0", "try", "1000", CHANNEL];
    for bad in 1..=3 {
        for at in [1, 2, 3, 7] {
            let mut args = good;
            args[at] = ["x", "", "1e"][bad - 1];
            let reply = args
                .iter()
                .fold(LEASE_ACQUIRE.key(&k.all[..]), |call, arg| call.arg(*arg))
                .invoke_acked(&mut conn)
                .await;
            let message = format!("{reply:?}");
            assert!(
                message.contains("not a number"),
                "argument {at} = {:?}: {message}",
                args[at]
            );
        }
    }
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.capacity, None, "nothing made");
}

#[tokio::test]
async fn a_token_follows_a_last_token_ahead_of_the_clock_by_one() {
    // Tokens are max(last token + 1, Redis time in µs): after a last token ahead of the
    // clock (a server whose clock went back), the next is that token + 1, on the general
    // path (a labelled request) as on the fast one. (Kills next_token()'s `+ 1` as `+ 2`.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 3, 1, false)).await);
    let ahead: u64 = 1 << 52;
    let () = conn.hset(&k.state, "tok", ahead).await.expect("hset");
    let labelled = Request {
        label: "l",
        ..req("b", 3, 1, false)
    };
    let (b, _) = granted(acquire(&mut conn, labelled).await);
    assert_eq!(b, ahead + 1);
    let (c, _) = granted(acquire(&mut conn, req("c", 3, 1, false)).await);
    assert_eq!(c, ahead + 2);
}

#[tokio::test]
async fn a_grant_into_holes_two_apart_sets_exactly_their_bits() {
    // Slots 1 and 3 free between held ones: a grant of two takes exactly those, and its
    // release frees exactly those. (Kills the run detection of set_slots() taking slots two
    // apart for one run.)
    let (_server, mut conn, k) = start().await;
    for id in ["s0", "s1", "s2", "s3", "s4"] {
        granted(acquire(&mut conn, req(id, 6, 1, false)).await);
    }
    for id in ["s1", "s3"] {
        release(&mut conn, &k, id).await.expect("release");
    }
    let (_, slots) = granted(acquire(&mut conn, req("pair", 6, 2, false)).await);
    assert_eq!(slots, vec![1, 3]);
    let bits: Vec<u8> = {
        let mut b = Vec::new();
        for slot in 0..6 {
            b.push(conn.getbit(&k.slots, slot).await.expect("getbit"));
        }
        b
    };
    assert_eq!(bits, vec![1, 1, 1, 1, 1, 0], "slots 0-4 held, 5 free");
    // Its release clears exactly those two, not the one between them.
    release(&mut conn, &k, "pair").await.expect("release");
    let mut bits = Vec::new();
    for slot in 0..6 {
        let bit: u8 = conn.getbit(&k.slots, slot).await.expect("getbit");
        bits.push(bit);
    }
    assert_eq!(bits, vec![1, 0, 1, 0, 1, 0], "slots 0, 2 and 4 still held");
}
