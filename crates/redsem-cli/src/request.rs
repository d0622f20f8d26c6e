//! The options of a permit request, shared by `run` and `acquire`, and the acquire itself:
//! one attempt (`--no-wait`), a bounded wait (`--wait`) or an unbounded one, with a spinner.

use std::time::Duration;

use redsem::{LeaseOptions, LeasePermit, Redsem};

use crate::cli::Context;
use crate::error::CliError;
use crate::signals::{self, Signals};
use crate::spinner::Spinner;
use crate::values;

/// NAME, `--limit`, `--lease`, `--wait`/`--no-wait` and `--holder`.
#[derive(Debug, clap::Args)]
pub(crate) struct PermitRequest {
    /// The semaphore's name
    #[arg(value_name = "NAME", value_parser = values::name)]
    pub(crate) name: String,

    /// How many permits of NAME may be held at once (its capacity)
    #[arg(long, value_name = "N", value_parser = values::limit, allow_hyphen_values = true)]
    pub(crate) limit: u32,

    /// How long the permit lives without renewal (renewed every third of it)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = values::lease)]
    pub(crate) lease: Duration,

    /// Wait at most DUR for a permit [default: as long as it takes]
    #[arg(long, value_name = "DUR", value_parser = values::duration)]
    pub(crate) wait: Option<Duration>,

    /// Make one attempt and never queue
    #[arg(long, conflicts_with = "wait")]
    pub(crate) no_wait: bool,

    /// A label kept with the permit and shown by `status` (a host name, a job id)
    #[arg(long, value_name = "LABEL", value_parser = values::label)]
    pub(crate) holder: Option<String>,

    /// At most one permit per --holder: fail (exit 1) if LABEL already holds or awaits one
    #[arg(long, requires = "holder")]
    pub(crate) one_per_holder: bool,
}

impl PermitRequest {
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
        let mut options = LeaseOptions::default()
            .lease(self.lease)
            .keepalive(keepalive)
            .one_per_label(self.one_per_holder);
        if let Some(label) = &self.holder {
            options = options.label(label.as_str());
        }
        let sem = redsem.lease_semaphore_with(&self.name, self.limit, options)?;
        let mut spinner = Spinner::new(&self.name, !self.no_wait && ctx.show_progress());
        let reporter = spinner.reporter();
        let granted = async {
            if self.no_wait {
                sem.try_acquire().await
            } else {
                sem.acquire_with_progress(1, self.wait, reporter).await
            }
        };
        tokio::select! {
            granted = granted => Ok(granted?),
            signal = signals.recv() => Err(signals::interrupted(
                signal,
                &format!("waiting for {:?}", self.name),
            )),
            never = spinner.spin() => match never {},
        }
    }
}
