//! [`HeldLease`]: the request's permit as its handler sees it, and [`CarryLease`], how it
//! gets there.

use std::fmt;
use std::sync::Arc;

use crate::{FencingToken, LeasePermit, PermitId};

/// The permit a request holds, as its handler sees it: in the extensions of an
/// [`http::Request`] (axum: `Extension<HeldLease>`), or handed to [`CarryLease::carry`].
///
/// Cloning shares the one permit. The layer releases it when the response future completes,
/// even if the handler kept a clone (moved into a spawned task, say): from then on that clone
/// reads a released permit ([`HeldLease::is_lost`] is true, [`HeldLease::lost`] resolves).
#[derive(Clone)]
pub struct HeldLease {
    pub(super) permit: Arc<LeasePermit>,
}

impl HeldLease {
    /// The fencing token of the grant, to pass to the resource the limit protects.
    pub fn token(&self) -> FencingToken {
        self.permit.token()
    }

    /// The permit's slot, in `0..capacity`.
    pub fn slot(&self) -> u32 {
        self.permit.slot()
    }

    /// The permit's id.
    pub fn id(&self) -> &PermitId {
        self.permit.id()
    }

    /// The name of the semaphore.
    pub fn semaphore(&self) -> &str {
        self.permit.semaphore()
    }

    /// True once the lease is known lost or may have ended ([`LeasePermit::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.permit.is_lost()
    }

    /// Resolves when the lease is known lost or may have ended ([`LeasePermit::lost`]);
    /// also once the layer has released it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) {
        self.permit.lost().await;
    }
}

impl fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HeldLease").field(&self.permit).finish()
    }
}

/// A request type that can carry the [`HeldLease`] of its call to the handler.
///
/// Implemented for [`http::Request`] (into its extensions). For another request type,
/// implement it (the body may be empty, `impl CarryLease for MyRequest {}`, when its handlers
/// do not need the lease).
pub trait CarryLease {
    /// Keep `lease` where the handler can find it. The default drops it.
    fn carry(&mut self, lease: HeldLease) {
        let _ = lease;
    }
}

impl<B> CarryLease for http::Request<B> {
    fn carry(&mut self, lease: HeldLease) {
        self.extensions_mut().insert(lease);
    }
}
