//! The tower layer's `tenant_from`: each request queues as the tenant it names, so the
//! semaphore's fair shares hold between the callers of a service. On a throwaway
//! redis-server, with a bare tower service (`service_fn`) whose requests carry an `x-tenant`
//! header.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redsem::tower::{LeaseLimitLayer, LimitError};
use redsem::{LeaseSemaphore, Redsem, Tenant};
use redsem_test::{RedisServer, within};
use tower::{ServiceBuilder, ServiceExt as _, service_fn};

/// The bound of every wait.
const LIMIT: Duration = Duration::from_secs(10);

/// The tenant of a request: its `x-tenant` header (none: the default tenant).
fn tenant_of(request: &http::Request<()>) -> Option<Tenant> {
    let name = request.headers().get("x-tenant")?.to_str().ok()?;
    Some(Tenant::new(name))
}

fn request(tenant: Option<&str>) -> http::Request<()> {
    let mut builder = http::Request::builder().uri("/work");
    if let Some(tenant) = tenant {
        builder = builder.header("x-tenant", tenant);
    }
    builder.body(()).expect("a request")
}

/// Wait until `sem` has `n` waiters.
async fn until_waiters(sem: &LeaseSemaphore, n: usize) {
    within(LIMIT, "the request queued", async {
        while sem.status().await.expect("status").waiters.len() != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

async fn connect(server: &RedisServer) -> Redsem {
    within(LIMIT, "connect", Redsem::connect(&server.url()))
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queue_as_the_tenant_their_header_names_and_take_turns() {
    let server = RedisServer::start();
    let redsem = connect(&server).await;
    let sem = redsem.lease_semaphore("tower-tenants", 2).expect("sem");
    // Who was served, in the order the handler ran (one at a time: the flooding tenant keeps
    // one of the two units throughout).
    let served: Arc<Mutex<Vec<String>>> = Arc::default();
    let service = ServiceBuilder::new()
        .layer(LeaseLimitLayer::waiting(sem.clone(), LIMIT).tenant_from(tenant_of))
        .service(service_fn({
            let served = served.clone();
            move |request: http::Request<()>| {
                let served = served.clone();
                async move {
                    let tenant = request
                        .headers()
                        .get("x-tenant")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    served
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(tenant);
                    Ok::<_, Infallible>(())
                }
            }
        }));

    // The flooding tenant holds both units and queues three requests; then a quiet one comes.
    let flood = sem.for_tenant(Tenant::new("flood")).expect("tenant");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            within(LIMIT, "flood's permits", flood.acquire())
                .await
                .expect("granted"),
        );
    }
    let mut calls = Vec::new();
    for (i, tenant) in ["flood", "flood", "flood", "quiet"].into_iter().enumerate() {
        let call = service.clone().oneshot(request(Some(tenant)));
        calls.push(tokio::spawn(call));
        until_waiters(&sem, i + 1).await;
    }
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    let queued: Vec<Option<&str>> = status.waiters.iter().map(|w| w.tenant.as_deref()).collect();
    assert_eq!(
        queued,
        [Some("flood"), Some("flood"), Some("flood"), Some("quiet")]
    );
    let quiet = status
        .tenants
        .iter()
        .find(|t| t.name == "quiet")
        .expect("quiet listed");
    assert_eq!((quiet.held, quiet.waiters), (0, 1));

    // One unit comes free while flood still holds the other: quiet (holding none) is next.
    within(LIMIT, "release", held.remove(0).release())
        .await
        .expect("release");
    for call in calls {
        within(LIMIT, "the call", call)
            .await
            .expect("join")
            .expect("served");
    }
    // Plain FIFO would serve quiet last, behind flood's backlog.
    let served = served.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(served, ["quiet", "flood", "flood", "flood"]);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_tenant_is_the_default_tenant_s_and_a_bad_one_is_refused() {
    let server = RedisServer::start();
    let redsem = connect(&server).await;
    let sem = redsem.lease_semaphore("tower-default", 1).expect("sem");
    let service = ServiceBuilder::new()
        .layer(LeaseLimitLayer::shedding(sem.clone()).tenant_from(tenant_of))
        .service(service_fn({
            let sem = sem.clone();
            move |_: http::Request<()>| {
                let sem = sem.clone();
                async move { Ok::<_, Infallible>(sem.status().await.expect("status")) }
            }
        }));

    let status = within(LIMIT, "call", service.clone().oneshot(request(None)))
        .await
        .expect("served");
    assert_eq!(status.holders.len(), 1);
    assert_eq!(status.holders[0].tenant, None);
    assert!(status.tenants.is_empty(), "{status:?}");

    let status = within(
        LIMIT,
        "call",
        service.clone().oneshot(request(Some("acme"))),
    )
    .await
    .expect("served");
    assert_eq!(status.holders[0].tenant.as_deref(), Some("acme"));

    // A name longer than a tenant's may be is refused before Redis is asked.
    let long = "x".repeat(redsem::MAX_TENANT_LEN + 1);
    let refused = within(LIMIT, "call", service.clone().oneshot(request(Some(&long)))).await;
    match refused {
        Err(LimitError::Redis(err)) => assert!(err.is_invalid_argument(), "{err}"),
        other => panic!("expected an invalid tenant, got {other:?}"),
    }
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    assert_eq!((status.in_use, status.waiters.len()), (0, 0));
}
