//! The permit semaphore's group commit (`lua/permit/batch.lua`; see [`crate::batch`]):
//! acquires, additions (releases) and withdrawals.

use crate::batch::{Group, Sent};
use crate::client::Redsem;
use crate::error::Result;
use crate::keys::PermitKeys;
use crate::script::{self, PermitOp};

/// One client's batches on one permit semaphore.
pub(crate) struct PermitGroup {
    pub(crate) redsem: Redsem,
    pub(crate) keys: PermitKeys,
    /// Where this client's waiters on it are woken.
    pub(crate) wake_channel: String,
}

impl Group for PermitGroup {
    type Op = PermitOp;
    const SCRIPT: &'static str = "permit_batch";

    async fn send(&self, ops: Vec<PermitOp>) -> Result<Sent> {
        let mut conn = self.redsem.conn_acked_if(ops.iter().any(|op| op.acked));
        let channel = &self.wake_channel;
        let (replies, unconfirmed) =
            script::permit_batch(&mut conn, &self.keys, channel, self.redsem.session(), &ops)
                .await?;
        Ok(Sent {
            replies,
            unconfirmed,
        })
    }
}
