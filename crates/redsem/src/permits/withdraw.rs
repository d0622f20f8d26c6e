//! The withdrawal of a cancelled or timed-out request: it leaves the queue, and permits
//! handed to it meanwhile are given back.

use super::PermitInner;
use crate::client::Redsem;
use crate::error::Result;
use crate::script;
use crate::wait::Queue;

impl Queue for PermitInner {
    fn redsem(&self) -> &Redsem {
        &self.redsem
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn wake_channel(&self) -> &str {
        &self.wake_channel
    }

    async fn withdraw(&self, id: &str, pending: Option<u64>) -> Result<()> {
        match &self.batcher {
            // After the acquire it withdraws, which may still wait in the batcher.
            Some(batcher) => {
                let (reply, _) = batcher
                    .submit(script::PermitOp::withdraw(id, pending))
                    .await?;
                script::withdrawn(script::Acked {
                    reply,
                    unconfirmed: None,
                })
                .map(drop)
            }
            None => {
                let mut conn = self.redsem.conn_unacked();
                let session = self.redsem.session();
                script::permit_withdraw(&mut conn, &self.keys, id, session, pending)
                    .await
                    .map(drop)
            }
        }
    }
}
