//! Fields the lease scripts did not write: a field of the state hash under an id's name that
//! is not a record of this layout reads as no record.

use super::*;

#[tokio::test]
async fn a_field_that_is_not_a_holder_record_reads_as_no_record() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = keys();
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let () = conn
        .hset(&k.all[2], "r:b", "h|not a record")
        .await
        .expect("hset");
    let (_, slots) = granted(acquire(&mut conn, req("b", 2, 1, false)).await);
    assert_eq!(slots, vec![1], "a new request: the next free slot");
}
