//! States of another layout: refused and left alone while live, an idle layout-1 state taken
//! over with its capacity and last token.

use super::support::*;

#[tokio::test]
async fn a_state_of_another_layout_is_refused_and_left_alone() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let () = conn.hset(&k.state, "layout", "9").await.expect("hset");
    let before = state_fields(&mut conn).await;
    let refused = |r: Result<()>| match r {
        Err(Error::Incompatible { key, found, ours }) => {
            assert_eq!(
                (key.as_str(), found.as_str(), ours.as_str()),
                (k.state.as_str(), "9", "2")
            );
        }
        other => panic!("expected Incompatible, got {other:?}"),
    };
    refused(
        lease_acquire(&mut conn, &k, &req("b", 2, 1, false))
            .await
            .map(|_| ()),
    );
    refused(release(&mut conn, &k, "a").await.map(|_| ()));
    refused(lease_status(&mut conn, &k).await.map(|_| ()));
    assert_eq!(before, state_fields(&mut conn).await, "nothing written");
}

#[tokio::test]
async fn a_layout_1_state_is_refused_while_live_and_taken_over_once_idle() {
    // Layout 1 kept a minute of tombstones. A live state of it (an older client
    // still holding) is refused and left alone; an idle one (drained) is taken over, its
    // tombstones dropped, its capacity and last token kept.
    let (_server, mut conn, k) = start().await;
    let token = 1_900_000_000_000_000_u64;
    let live = [
        ("cap", "2".to_owned()),
        ("used", "1".to_owned()),
        ("nh", "1".to_owned()),
        ("qlen", "0".to_owned()),
        ("nt", "1".to_owned()),
        ("tok", token.to_string()),
        ("layout", "1".to_owned()),
        ("r:old", format!("h|{token}|1|1|30000|0|")),
        ("r:gone", "x|R|attempt".to_owned()),
    ];
    let () = conn.hset_multiple(&k.state, &live).await.expect("hset");
    let () = conn
        .zadd_multiple(&k.leases, &[(9e15, "old"), (-9e15, "gone")])
        .await
        .expect("zadd");
    let () = conn.setbit(&k.slots, 0, true).await.expect("setbit");
    let before = state_fields(&mut conn).await;
    match lease_acquire(&mut conn, &k, &req("new", 2, 1, false)).await {
        Err(Error::Incompatible { found, ours, .. }) => {
            assert_eq!((found.as_str(), ours.as_str()), ("1", "2"));
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
    assert_eq!(before, state_fields(&mut conn).await, "nothing written");

    // Drained: the old holder released (as layout 1 leaves it: a tombstone).
    let () = conn
        .hset_multiple(
            &k.state,
            &[("used", "0"), ("nh", "0"), ("nt", "2"), ("r:old", "x|R|a2")],
        )
        .await
        .expect("hset");
    let () = conn.zadd(&k.leases, "old", -9e15).await.expect("zadd");
    let () = conn.setbit(&k.slots, 0, false).await.expect("setbit");
    let (next, slots) = granted(acquire(&mut conn, req("new", 2, 1, false)).await);
    assert!(next > token, "the last token is kept: {next} after {token}");
    assert_eq!(slots, vec![0]);
    let layout: String = conn.hget(&k.state, "layout").await.expect("hget");
    assert_eq!(layout, "2");
    for old in ["r:old", "r:gone"] {
        let record: Option<String> = conn.hget(&k.state, old).await.expect("hget");
        assert_eq!(record, None, "{old}: the tombstones are dropped");
    }
    let leases: Vec<String> = conn.zrange(&k.leases, 0, -1).await.expect("zrange");
    assert_eq!(leases, vec!["new".to_owned()]);
}

/// A state of layout 1 that nobody holds or waits on, with capacity 3 and last token `token`.
async fn idle_layout_1_state(conn: &mut Conn, token: u64) {
    let k = keys();
    let fields = [
        ("cap", "3".to_owned()),
        ("used", "0".to_owned()),
        ("nh", "0".to_owned()),
        ("qlen", "0".to_owned()),
        ("nt", "1".to_owned()),
        ("tok", token.to_string()),
        ("layout", "1".to_owned()),
        ("r:old", "x|R|attempt".to_owned()),
    ];
    let () = conn.hset_multiple(&k.state, &fields).await.expect("hset");
    let () = conn.zadd(&k.leases, "old", -9e15).await.expect("zadd");
}

#[tokio::test]
async fn a_layout_1_state_taken_over_by_a_status_keeps_its_capacity_and_last_token() {
    // The takeover writes the state of this layout itself, whichever call makes it: here one
    // that grants nothing, so nothing else writes the capacity or the token for it.
    // (Kills adopt() dropping the capacity, the last token or the wide field.)
    let (_server, mut conn, k) = start().await;
    let token = 1_900_000_000_000_000_u64;
    idle_layout_1_state(&mut conn, token).await;
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.capacity, Some(3));
    let (cap, tok, layout): (Option<String>, Option<String>, Option<String>) =
        state_fields_raw(&mut conn, &["cap", "tok", "layout"]).await;
    assert_eq!(cap.as_deref(), Some("3"));
    assert_eq!(tok, Some(token.to_string()));
    assert_eq!(layout.as_deref(), Some("2"));
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(&k.state)
        .query_async(&mut conn)
        .await
        .expect("OBJECT ENCODING");
    assert_eq!(
        encoding, "hashtable",
        "kept as a hash table (the wide field)"
    );
    // A status again: still a state, and the next grant's token follows the old one.
    assert_eq!(
        lease_status(&mut conn, &k).await.expect("status").capacity,
        Some(3)
    );
    let (next, _) = granted(acquire(&mut conn, req("new", 3, 1, false)).await);
    assert!(next > token, "the last token is kept: {next} after {token}");
}

#[tokio::test]
async fn an_idle_state_of_a_newer_layout_is_refused_untouched() {
    // Only an idle layout-1 state is taken over; a newer layout's, idle or not, is left to
    // the version that wrote it. (Kills the layout test reading any layout as 1.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("first", 2, 1, false)).await);
    release(&mut conn, &k, "first").await.expect("release");
    let () = conn.hset(&k.state, "layout", "4").await.expect("hset");
    match acquire_result(&mut conn, req("a", 2, 1, false)).await {
        Err(Error::Incompatible { found, .. }) => assert_eq!(found, "4"),
        other => panic!("expected Incompatible, got {other:?}"),
    }
    let layout: String = conn.hget(&k.state, "layout").await.expect("hget");
    assert_eq!(layout, "4", "untouched");
}

#[tokio::test]
async fn a_layout_1_takeover_in_a_batch_forgets_the_records_it_read() {
    // A batch reads its requests' records with the state; an idle layout-1 state it then
    // takes over drops them all, also those read already: a layout-1 tombstone under the id
    // of a new request does not make that request a known one. (Whether the takeover forgets
    // what it read makes no difference for such a state: the mutant that keeps it is listed
    // in equivalent.txt.)
    let (_server, mut conn, k) = start().await;
    idle_layout_1_state(&mut conn, 1_900_000_000_000_000).await;
    let () = conn
        .hset(&k.state, "r:new", "x|R|attempt")
        .await
        .expect("hset");
    let op = |id: &str, seq: u64| -> Vec<String> {
        ["a", id, "3", "1", "30000", "", "0", "try", "30000"]
            .iter()
            .map(|s| (*s).to_owned())
            .chain([
                Hex(seq).to_string(),
                String::new(),
                String::new(),
                String::new(),
            ])
            .collect()
    };
    let ops = [
        op("new", number("takeover new")),
        op("other", number("takeover other")),
    ];
    let replies = raw_batch(&mut conn, session().id(), session().low(), &ops[..]).await;
    for (id, reply) in ["new", "other"].iter().zip(replies) {
        let answer = decode_acquire("lease_batch", reply.clone()).expect("decode");
        assert!(
            matches!(answer, Acquire::Granted { .. }),
            "{id}: {answer:?}"
        );
    }
}
