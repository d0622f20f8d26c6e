//! The managed services' refusals, emulated (`redsem_test::profiles`): as each service's user,
//! the connect-time checks pass (or say what they could not read), and every primitive works:
//! lease semaphore with a woken waiter, mutex, permits, latch, status, the names listed. Where
//! redsem cannot work (OCI Cache's sharded clusters refuse scripts; ElastiCache Serverless
//! refuses the `WAIT` that `replica_acks` sends) the connect fails naming the command.

use std::time::Duration;

use redsem::{Error, Redsem, RedsemOptions, ServerChecks, Verdict};
use redsem_test::profiles::{self, Profile};

use crate::support::{LIMIT, RedisServer, connect_with, short, within};

/// The profile's server and a client logged in as its user (default server checks).
async fn connect(
    profile: &Profile,
    options: RedsemOptions,
) -> (RedisServer, redsem::Result<Redsem>) {
    let server = profile.start_server();
    let url = profile.login(&server);
    let redsem = connect_with(&url, options).await;
    (server, redsem)
}

/// Every primitive, as one service's user.
async fn use_every_primitive(profile: &Profile, redsem: &Redsem) -> redsem::Result<()> {
    let name = profile.name;
    // Lease semaphore: a grant, a waiter woken by the release (pub/sub), status, names.
    let sem = redsem.lease_semaphore_with(name, 1, short(2_000))?;
    let held = sem.try_acquire().await?;
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_timeout(LIMIT).await })
    };
    crate::support::until("the waiter queues", || {
        let sem = sem.clone();
        async move { sem.status().await.is_ok_and(|s| s.waiters.len() == 1) }
    })
    .await;
    held.release().await?;
    let next = within(LIMIT, "the waiter is granted", waiter)
        .await
        .expect("the waiter task")?;
    let status = sem.status().await?;
    assert_eq!(status.holders.len(), 1, "{name}: {status:?}");
    next.release().await?;
    assert_eq!(
        redsem.lease_semaphore_names().await?,
        vec![name.to_owned()],
        "{name}"
    );
    // Mutex.
    let mutex = redsem.mutex(&format!("{name}-mutex"))?;
    let guard = within(LIMIT, "lock", mutex.lock()).await?;
    assert!(mutex.try_lock().await.is_err(), "{name}: locked twice");
    guard.unlock().await?;
    // Permits: a waiter woken by a release.
    let permits = redsem.permit_semaphore(&format!("{name}-permits"))?;
    permits.ensure_permits(1).await?;
    permits.try_acquire(1).await?;
    let waiting = {
        let permits = permits.clone();
        tokio::spawn(async move { permits.acquire_timeout(1, LIMIT).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    permits.release(1).await?;
    within(LIMIT, "the permit waiter", waiting)
        .await
        .expect("the permit waiter task")?;
    assert_eq!(permits.available_permits().await?, 0, "{name}");
    assert_eq!(redsem.permit_semaphore_names().await?.len(), 1, "{name}");
    // Latch: a waiter woken by the last count-down.
    let latch = redsem.count_down_latch(&format!("{name}-latch"))?;
    assert!(latch.try_set_count(2).await?);
    let opened = {
        let latch = latch.clone();
        tokio::spawn(async move { latch.wait_timeout(LIMIT).await })
    };
    latch.count_down().await?;
    latch.count_down().await?;
    within(LIMIT, "the latch waiter", opened)
        .await
        .expect("the latch waiter task")?;
    assert_eq!(latch.count().await?, 0, "{name}");
    assert_eq!(redsem.count_down_latch_names().await?.len(), 1, "{name}");
    Ok(())
}

#[tokio::test]
async fn every_primitive_works_as_each_managed_services_user() {
    for profile in profiles::usable() {
        let (_server, redsem) = connect(profile, RedsemOptions::default().prefix("p")).await;
        let redsem = redsem.unwrap_or_else(|e| {
            panic!(
                "{} ({}): connect: {}",
                profile.name,
                profile.services,
                redsem_chain(&e)
            )
        });
        use_every_primitive(profile, &redsem)
            .await
            .unwrap_or_else(|e| panic!("{}: {}", profile.name, redsem_chain(&e)));
    }
}

#[tokio::test]
async fn the_server_checks_find_nothing_unsuitable_and_say_what_they_could_not_read() {
    for profile in profiles::usable() {
        let (_server, redsem) = connect(profile, RedsemOptions::default().prefix("p")).await;
        let redsem = redsem.unwrap_or_else(|e| panic!("{}: {}", profile.name, redsem_chain(&e)));
        let findings = within(LIMIT, "check_server", redsem.check_server())
            .await
            .unwrap_or_else(|e| panic!("{}: {}", profile.name, redsem_chain(&e)));
        let unsuitable: Vec<_> = findings
            .iter()
            .filter(|f| f.verdict == Verdict::Unsuitable)
            .collect();
        assert!(unsuitable.is_empty(), "{}: {unsuitable:?}", profile.name);
        if profile.refuses("info") {
            // The eviction policy is read from INFO: unread, and said so, naming INFO.
            assert!(
                findings
                    .iter()
                    .any(|f| f.setting == "maxmemory-policy" && f.problem.contains("INFO")),
                "{}: {findings:?}",
                profile.name
            );
        } else {
            assert!(findings.is_empty(), "{}: {findings:?}", profile.name);
        }
    }
}

#[tokio::test]
async fn a_service_that_refuses_scripts_is_refused_at_connect_naming_them() {
    let profile = &profiles::OCI_SHARDED_PROFILE;
    let (_server, redsem) = connect(profile, RedsemOptions::default().prefix("p")).await;
    match redsem {
        Err(Error::Unsuitable { setting, problem }) => {
            assert_eq!(setting, "ACL commands");
            for command in ["SCRIPT LOAD", "EVALSHA"] {
                assert!(problem.contains(command), "names {command}: {problem}");
            }
        }
        other => panic!("expected Error::Unsuitable, got {other:?}"),
    }
}

#[tokio::test]
async fn without_checks_an_operation_on_a_service_without_scripts_names_the_refused_command() {
    let profile = &profiles::OCI_SHARDED_PROFILE;
    let options = RedsemOptions::default()
        .prefix("p")
        .server_checks(ServerChecks::Off);
    let (_server, redsem) = connect(profile, options).await;
    let redsem = redsem.expect("connect without checks");
    let sem = redsem.lease_semaphore("jobs", 1).expect("sem");
    let err = within(LIMIT, "try_acquire", sem.try_acquire())
        .await
        .expect_err("no scripts, no grant");
    let chain = redsem_chain(&err);
    assert!(
        chain.to_ascii_lowercase().contains("evalsha"),
        "the error names EVALSHA: {chain}"
    );
}

#[tokio::test]
async fn replica_acks_where_wait_is_refused_fail_the_connect_naming_wait() {
    let profile = &profiles::AWS_SERVERLESS_PROFILE;
    let options = RedsemOptions::default()
        .prefix("p")
        .replica_acks(1, Duration::from_millis(100));
    let (_server, redsem) = connect(profile, options).await;
    match redsem {
        Err(Error::Unsuitable { setting, problem }) => {
            assert!(setting.contains("ACL commands"), "{setting}");
            assert!(problem.contains("WAIT"), "names WAIT: {problem}");
            assert!(problem.contains("replica_acks"), "says why: {problem}");
        }
        other => panic!("expected Error::Unsuitable, got {other:?}"),
    }
}

/// The error and its sources, joined.
fn redsem_chain(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
