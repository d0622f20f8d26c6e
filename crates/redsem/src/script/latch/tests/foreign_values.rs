//! A foreign value at one of the latch's keys, or a count Redis cannot count down: reported
//! and left alone.

use super::support::*;

#[tokio::test]
async fn every_latch_script_reports_a_foreign_key_and_leaves_it_alone() {
    let (_server, mut conn, k) = start().await;
    for (i, key) in k.all.iter().enumerate() {
        only_a_foreign_list_at(&mut conn, &k.all, key).await;
        let mut conn2 = conn.clone();
        let results: Vec<(&str, Result<()>)> = vec![
            (
                "try_set",
                latch_try_set(&mut conn2, &k, 1, caller("r"))
                    .await
                    .map(drop),
            ),
            (
                "count_down",
                latch_count_down(&mut conn2, &k, caller("r"))
                    .await
                    .map(drop),
            ),
            ("state", latch_state(&mut conn2, &k).await.map(drop)),
            ("delete", latch_delete(&mut conn2, &k).await.map(drop)),
        ];
        assert_wrong_type(results, key, i);
        let value: Vec<String> = conn.lrange(key, 0, -1).await.expect("lrange");
        assert_eq!(value, ["foreign"], "key #{i} was overwritten");
    }
}

#[tokio::test]
async fn the_last_count_down_meeting_a_foreign_done_key_reports_it_and_opens_nothing() {
    let (_server, mut conn, k) = start_with_count(1).await;
    let _: () = conn.rpush(&k.done, "foreign").await.expect("rpush");
    let result = latch_count_down(&mut conn, &k, caller("r")).await.map(drop);
    assert_wrong_type(vec![("count_down", result)], &k.done, 1);
    let value: Vec<String> = conn.lrange(&k.done, 0, -1).await.expect("lrange");
    assert_eq!(value, ["foreign"], "left alone");
    let count: i64 = conn.get(&k.count).await.expect("get");
    assert_eq!(count, 1, "still counting");
}

#[tokio::test]
async fn a_count_redis_cannot_count_down_is_reported_as_foreign_and_left_alone() {
    // "007" reads as 7 to Lua but DECR refuses it: the latch takes it for a foreign value.
    let (_server, mut conn, k) = start().await;
    let () = conn.set(&k.count, "007").await.expect("set");
    let result = latch_count_down(&mut conn, &k, caller("c")).await.map(drop);
    assert_wrong_type(vec![("count_down", result)], &k.count, 0);
    let count: String = conn.get(&k.count).await.expect("get");
    assert_eq!(count, "007", "left alone");
}

#[tokio::test]
async fn a_count_down_that_does_not_open_the_latch_leaves_a_foreign_done_key_to_the_one_that_does()
{
    // The done key is read (type-checked) only by a count-down that may write it: the last.
    // Earlier ones count down past a foreign value there. (Kills the done key read by every
    // count-down.)
    let (_server, mut conn, k) = start_with_count(3).await;
    let () = conn.rpush(&k.done, "foreign").await.expect("rpush");
    assert_eq!(
        latch_count_down(&mut conn, &k, caller("c1"))
            .await
            .expect("down"),
        CountDown::Counted(2)
    );
}
