//! Giving units back: a permit's release (by its holder, by id, in the background for a
//! dropped permit) and the withdrawal of a cancelled request, each a call of the client's
//! session sent once more if Redis could not be reached.

use super::SemInner;
use crate::client::Redsem;
use crate::error::{Error, Result};
use crate::retry::retry_once;
use crate::script::{self, Release, ReleaseBy};
use crate::session::Caller;
use crate::types::PermitId;
use crate::wait::Queue;

impl SemInner {
    /// Release `id`, sent once more if Redis could not be reached ([`retry_once`]): a
    /// release whose reply was lost answers what it did. It is one call of the client's
    /// session ([`crate::session`]), so its resend answers [`Release::Released`] while an id
    /// that another call released (someone's [`LeaseSemaphore::release_id`], the lease's end)
    /// answers [`Release::NotHeld`].
    pub(crate) async fn release(&self, id: &str) -> Result<Release> {
        let session = self.redsem.session();
        let seq = session.open();
        let by = ReleaseBy::Holder(Caller::new(session, seq.n()));
        retry_once("release", || async {
            match &self.batcher {
                Some(batcher) => {
                    let op = script::BatchOp::release(id, by);
                    let (reply, unconfirmed) = batcher.submit(op).await?;
                    script::batch_release(reply, unconfirmed)
                }
                None => self.release_on(&mut self.redsem.conn(), id, by).await,
            }
        })
        .await
    }

    /// One release of `id` on `conn` (with or without replica acknowledgements), by `by`.
    async fn release_on(
        &self,
        conn: &mut impl crate::script::Scripting,
        id: &str,
        by: ReleaseBy<'_>,
    ) -> Result<Release> {
        let released = script::lease_release(conn, &self.keys, id, &self.wake_channel, by).await?;
        self.redsem
            .after_release(&self.keys, &released.handed, released.idle)
            .await;
        Ok(released.outcome)
    }

    pub(crate) fn not_held(&self, id: &PermitId) -> Error {
        Error::NotHeld {
            name: self.name.clone(),
            id: id.to_string(),
        }
    }
}

impl Queue for SemInner {
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
        let by = ReleaseBy::Withdrawal {
            session: self.redsem.session(),
            pending,
        };
        retry_once("withdraw", || async {
            match &self.batcher {
                // After the acquire it withdraws, which may still wait in the batcher. (A
                // withdrawal needs no acknowledgement: see `conn_unacked`.)
                Some(batcher) => {
                    let (reply, _) = batcher.submit(script::BatchOp::release(id, by)).await?;
                    script::batch_release(reply, None)
                }
                None => {
                    self.release_on(&mut self.redsem.conn_unacked(), id, by)
                        .await
                }
            }
        })
        .await
        .map(drop)
    }
}
