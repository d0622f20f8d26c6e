//! A native call's reply, built while the call is worked out and sent once it is written.

use crate::api::{self, RedisModuleCtx};

/// A reply, built while the call is worked out and sent once it is written.
#[derive(Debug)]
pub(crate) enum Reply {
    Bulk(Vec<u8>),
    Int(i64),
    Array(Vec<Reply>),
}

pub(crate) fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(b.to_vec())
}

pub(crate) fn int(n: u64) -> Reply {
    Reply::Int(n as i64)
}

pub(crate) unsafe fn send(ctx: *mut RedisModuleCtx, reply: &Reply) {
    match reply {
        Reply::Bulk(b) => api::reply_bulk(ctx, b),
        Reply::Int(n) => api::reply_integer(ctx, *n),
        Reply::Array(items) => {
            api::reply_array(ctx, items.len());
            for item in items {
                send(ctx, item);
            }
        }
    }
}
