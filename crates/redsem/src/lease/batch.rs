//! The lease semaphore's group commit (`lua/lease/batch.lua`; see [`crate::batch`]):
//! acquires, releases and withdrawals; grants made to this client's own waiters are handed
//! over before the operations are answered.

use crate::batch::{Group, Sent};
use crate::client::Redsem;
use crate::error::Result;
use crate::keys::LeaseKeys;
use crate::script::{self, BatchOp};

/// One client's batches on one lease semaphore.
pub(crate) struct LeaseGroup {
    pub(crate) redsem: Redsem,
    pub(crate) keys: LeaseKeys,
    /// Where this client's waiters on it are woken.
    pub(crate) wake_channel: String,
}

impl Group for LeaseGroup {
    type Op = BatchOp;
    const SCRIPT: &'static str = "lease_batch";

    async fn send(&self, ops: Vec<BatchOp>) -> Result<Sent> {
        let mut conn = self.redsem.conn_acked_if(ops.iter().any(BatchOp::acked));
        let shared = &self.redsem.shared;
        let batch = script::lease_batch(
            &mut conn,
            &self.keys,
            &self.wake_channel,
            &shared.session,
            &ops,
        )
        .await?;
        self.redsem
            .after_release(&self.keys, &batch.handed, batch.idle)
            .await;
        Ok(Sent {
            replies: batch.replies,
            unconfirmed: batch.unconfirmed,
        })
    }
}
