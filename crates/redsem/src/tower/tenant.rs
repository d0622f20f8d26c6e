//! [`TenantOf`]: how a [`LeaseLimit`](super::LeaseLimit) finds the tenant of a request, and
//! [`TenantFrom`], the closure of [`LeaseLimitLayer::tenant_from`](super::LeaseLimitLayer::tenant_from)
//! with its cache of per-tenant handles.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::{LeaseSemaphore, Tenant};

/// How many per-tenant handles a [`TenantFrom`] keeps (shared by the clones of its layer and
/// services). Past this many distinct tenants, a request of a tenant not kept gets a handle
/// of its own ([`LeaseSemaphore::for_tenant`], a few clones), which is dropped with it.
pub const TENANT_HANDLES: usize = 1024;

/// How a [`LeaseLimit`](super::LeaseLimit) finds the tenant of a request: [`NoTenant`] (the
/// default: every request is the default tenant's) or [`TenantFrom`] (made by
/// [`LeaseLimitLayer::tenant_from`](super::LeaseLimitLayer::tenant_from)).
pub trait TenantOf<Req> {
    /// The semaphore handle `request` takes its permit from: `sem` itself, or a handle on it
    /// for the request's tenant.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a tenant name, weight or
    /// cap out of range (see [`Tenant`]).
    fn semaphore_for(&self, sem: &LeaseSemaphore, request: &Req) -> crate::Result<LeaseSemaphore>;
}

/// Every request is the default tenant's (no tenant named): the semaphore's plain queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTenant;

impl<Req> TenantOf<Req> for NoTenant {
    fn semaphore_for(&self, sem: &LeaseSemaphore, _: &Req) -> crate::Result<LeaseSemaphore> {
        Ok(sem.clone())
    }
}

/// The tenant of a request, as a closure reads it (a header, a path segment, an API key's
/// owner); `None` for the default tenant. Made by
/// [`LeaseLimitLayer::tenant_from`](super::LeaseLimitLayer::tenant_from).
///
/// It keeps the handle of each tenant it has seen ([`LeaseSemaphore::for_tenant`]), up to
/// [`TENANT_HANDLES`] of them, so that a tenant's requests share one handle (and its metric
/// keys).
#[derive(Clone)]
pub struct TenantFrom<F> {
    tenant: F,
    handles: Arc<Mutex<HashMap<Tenant, LeaseSemaphore>>>,
}

impl<F> TenantFrom<F> {
    pub(super) fn new(tenant: F) -> TenantFrom<F> {
        TenantFrom {
            tenant,
            handles: Arc::default(),
        }
    }

    /// How many tenants' handles it keeps.
    pub fn handles_kept(&self) -> usize {
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl<F> fmt::Debug for TenantFrom<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantFrom")
            .field("handles_kept", &self.handles_kept())
            .finish_non_exhaustive()
    }
}

impl<F, Req> TenantOf<Req> for TenantFrom<F>
where
    F: Fn(&Req) -> Option<Tenant>,
{
    fn semaphore_for(&self, sem: &LeaseSemaphore, request: &Req) -> crate::Result<LeaseSemaphore> {
        let Some(tenant) = (self.tenant)(request) else {
            return Ok(sem.clone());
        };
        let mut handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = handles.get(&tenant) {
            return Ok(handle.clone());
        }
        let handle = sem.for_tenant(tenant.clone())?;
        if handles.len() < TENANT_HANDLES {
            handles.insert(tenant, handle.clone());
        }
        Ok(handle)
    }
}
