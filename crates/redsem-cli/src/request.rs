//! The options of a permit request, shared by `run`, `lock` and `acquire`, and the acquire
//! itself: one attempt (`--no-wait`), a bounded wait (`--wait`) or an unbounded one, shown by
//! a [`Spinner`].

use std::time::Duration;

use redsem::{LeaseOptions, LeasePermit, Redsem, Tenant};
use tokio::time::Instant;

use crate::context::Context;
use crate::error::{CliError, exit};
use crate::output;
use crate::signals::{self, Signals};
use crate::spinner::Spinner;
use crate::values;

/// NAME, `--limit` and the [`RequestOptions`]: a request for a permit of a lease semaphore.
#[derive(Debug, clap::Args)]
pub(crate) struct PermitRequest {
    /// The semaphore's name
    #[arg(value_name = "NAME", value_parser = values::name)]
    pub(crate) name: String,

    /// How many permits of NAME may be held at once (its capacity)
    #[arg(
        short,
        long,
        value_name = "N",
        value_parser = values::limit,
        allow_hyphen_values = true
    )]
    pub(crate) limit: u32,

    #[command(flatten)]
    pub(crate) options: RequestOptions,
}

/// `--lease`, `--wait`/`--no-wait`, `--holder`, `--one-per-holder` and the tenant's
/// `--tenant`, `--weight` and `--cap`.
#[derive(Debug, clap::Args)]
pub(crate) struct RequestOptions {
    /// How long the permit lives without renewal (renewed every third of it)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = values::lease)]
    pub(crate) lease: Duration,

    #[command(flatten)]
    pub(crate) patience: Patience,

    /// A label kept with the permit and shown by `status` (a host name, a job id)
    #[arg(long, value_name = "LABEL", value_parser = values::label)]
    pub(crate) holder: Option<String>,

    /// At most one permit per --holder: fail if LABEL already holds or awaits one
    #[arg(long, requires = "holder")]
    pub(crate) one_per_holder: bool,

    /// Whose request this is: tenants share NAME in fair shares (the next free unit goes to
    /// the waiting tenant holding the least per weight)
    #[arg(long, value_name = "T", value_parser = values::tenant)]
    pub(crate) tenant: Option<String>,

    /// The tenant's weight: its share is proportional to it [default: 1]
    #[arg(long, value_name = "W", requires = "tenant", value_parser = values::weight)]
    pub(crate) weight: Option<u32>,

    /// The most units the tenant may hold at once [default: no cap]
    #[arg(long, value_name = "C", requires = "tenant", value_parser = values::cap)]
    pub(crate) cap: Option<u32>,
}

impl RequestOptions {
    /// The tenant of `--tenant`, `--weight` and `--cap`, if one is named.
    pub(crate) fn tenant(&self) -> Option<Tenant> {
        let name = self.tenant.as_ref()?;
        let mut tenant = Tenant::new(name.as_str());
        if let Some(weight) = self.weight {
            tenant = tenant.weight(weight);
        }
        if let Some(cap) = self.cap {
            tenant = tenant.cap(cap);
        }
        Some(tenant)
    }
}

/// `-w/--wait DUR` (also spelled `--timeout`) and `-n/--no-wait` (also `--nonblock`): how
/// long to wait, as `flock(1)` spells it.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct Patience {
    /// Wait at most DUR (500ms, 2m, or seconds: 30) [default: as long as it takes]
    #[arg(
        short,
        long,
        visible_alias = "timeout",
        value_name = "DUR",
        value_parser = values::duration
    )]
    pub(crate) wait: Option<Duration>,

    /// Make one attempt and never queue
    #[arg(short, long, visible_alias = "nonblock", conflicts_with = "wait")]
    pub(crate) no_wait: bool,
}

impl PermitRequest {
    /// Refuse (exit 2, before anything is sent) a `--replica-acks` wait longer than a third of
    /// `--lease`: the lease runs on the server while the primary waits for the replicas, so a
    /// grant or renewal could end its own lease before it is answered.
    pub(crate) fn check_replica_acks(&self, ctx: &Context) -> Result<(), CliError> {
        let lease = self.options.lease;
        match ctx.replica_acks() {
            Some(acks) if acks.timeout > lease / 3 => Err(CliError::new(
                exit::USAGE,
                format!(
                    "--replica-acks waits up to {} for the replicas, more than a third of \
                     --lease {}: a grant or renewal could outlive its own lease while it waits; \
                     shorten the wait (--replica-acks {}/DUR) or lengthen --lease",
                    output::duration(acks.timeout),
                    output::duration(lease),
                    acks.replicas
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Take a permit as the flags say. With `keepalive` it is renewed in the background until
    /// released or dropped; without, it lives one lease.
    ///
    /// A signal received while waiting withdraws the request and ends with exit 128 + signal.
    pub(crate) async fn acquire(
        &self,
        redsem: &Redsem,
        keepalive: bool,
        ctx: &Context,
        signals: &mut Signals,
    ) -> Result<LeasePermit, CliError> {
        let request = &self.options;
        let mut options = LeaseOptions::default()
            .lease(request.lease)
            .keepalive(keepalive)
            .one_per_label(request.one_per_holder);
        if let Some(label) = &request.holder {
            options = options.label(label.as_str());
        }
        if let Some(tenant) = request.tenant() {
            options = options.tenant(tenant);
        }
        let sem = redsem.lease_semaphore_with(&self.name, self.limit, options)?;
        let no_wait = request.patience.no_wait;
        let mut spinner = Spinner::new(&self.name, ctx.progress(!no_wait));
        let reporter = spinner.reporter();
        let started = Instant::now();
        let granted = async {
            if no_wait {
                sem.try_acquire().await
            } else {
                sem.acquire_with_progress(1, request.patience.wait, reporter)
                    .await
            }
        };
        let permit = tokio::select! {
            granted = granted => granted?,
            signal = signals.recv() => return Err(signals::interrupted(
                signal,
                &format!("waiting for {:?}", self.name),
            )),
            never = spinner.spin() => match never {},
        };
        tracing::info!(
            name = %self.name,
            waited = %output::duration(started.elapsed()),
            id = %permit.id(),
            token = %permit.token(),
            slot = permit.slot(),
            "permit acquired"
        );
        Ok(permit)
    }
}
