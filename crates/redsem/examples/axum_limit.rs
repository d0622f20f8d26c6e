//! An axum app whose `/work` route runs at most `LIMIT` requests at once across every copy of
//! the app that shares the Redis at `REDIS_URL`: start it twice on two ports and the limit
//! still holds for both together. `/` is not limited.
//!
//! ```text
//! cargo run -p redsem --features tower --example axum_limit                  # port 3000, wait mode
//! PORT=3001 MODE=shed cargo run -p redsem --features tower --example axum_limit
//! curl -i localhost:3000/work
//! curl -i -H 'x-tenant: acme' localhost:3000/work
//! ```
//!
//! Settings (environment): `REDIS_URL` (default `redis://127.0.0.1:6379`), `PORT` (3000),
//! `LIMIT` (2 requests in flight), `MODE` (`wait`: queue up to `WAIT_MS`, default 1000 ms,
//! then 503; `shed`: 429 at once when full), `WORK_MS` (how long a request works, 300 ms).
//!
//! The `x-tenant` header names the request's tenant: tenants share the limit in fair shares
//! (the next free unit goes to the waiting tenant holding the fewest), so one caller that
//! floods `/work` cannot keep another's requests waiting behind its backlog. A request
//! without the header is the default tenant's. `redsem status axum-limit-work` lists the
//! tenants.
//!
//! Each answer of `/work` names the fencing token and slot the request ran under.

mod support;

use std::convert::Infallible;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Router};
use redsem::tower::{HeldLease, LeaseLimitLayer, LimitError};
use redsem::{Redsem, Tenant};
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> ExitCode {
    let url = support::redis_url();
    let redsem = match Redsem::connect(&url).await {
        Ok(redsem) => redsem,
        Err(err) => return support::exit_code(&url, Err(err)),
    };
    match serve(redsem).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

/// `name` from the environment, parsed, or `default` when unset.
fn setting<T: FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .map_err(|_| format!("{name}={text:?} is not a valid value")),
        Err(_) => Ok(default),
    }
}

async fn serve(redsem: Redsem) -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = setting("PORT", 3000)?;
    let limit: u32 = setting("LIMIT", 2)?;
    let work = Duration::from_millis(setting("WORK_MS", 300)?);
    let mode: String = setting("MODE", "wait".to_owned())?;

    // Every copy of the app opens the same name with the same capacity: one limit for all.
    // The label names the copy in `redsem status axum-limit-work` (its port and pid).
    let label = format!("axum-limit :{port} pid {}", std::process::id());
    let options = redsem::LeaseOptions::default().label(label);
    let sem = redsem.lease_semaphore_with("axum-limit-work", limit, options)?;
    let layer = match mode.as_str() {
        "wait" => LeaseLimitLayer::waiting(sem, Duration::from_millis(setting("WAIT_MS", 1000)?)),
        "shed" => LeaseLimitLayer::shedding(sem),
        other => return Err(format!("MODE={other:?}: expected wait or shed").into()),
    };
    // The tenant from the `x-tenant` header; none (or not text): the default tenant.
    let layer = layer.tenant_from(|request: &axum::extract::Request| {
        let name = request.headers().get("x-tenant")?.to_str().ok()?;
        (!name.is_empty()).then(|| Tenant::new(name))
    });

    let app = Router::new()
        .route(
            "/work",
            get(move |Extension(lease): Extension<HeldLease>| async move {
                tokio::time::sleep(work).await;
                format!(
                    "worked under token {} in slot {}\n",
                    lease.token(),
                    lease.slot()
                )
            }),
        )
        // `route_layer`: only requests that matched a route take a permit (a 404 does not).
        .route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(refused))
                .layer(layer),
        )
        .route("/", get(|| async { "try /work\n" }));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}/work, {mode} mode, at most {limit} in flight across the fleet",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}

/// The answer to a request the limit turned away: 429 when shed, 503 when its wait ran out,
/// its lease was lost or Redis could not be reached.
async fn refused(err: LimitError<Infallible>) -> (StatusCode, String) {
    let status = err
        .http_status()
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, format!("{err}\n"))
}
