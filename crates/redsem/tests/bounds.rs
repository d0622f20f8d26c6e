//! Compile-time checks of the public surface: every public type can be sent to and shared
//! between threads, and every future an async method returns can be sent, so the primitives work
//! in `tokio::spawn` and behind an `Arc` on a multi-threaded runtime.
//!
//! Nothing here talks to Redis: a check fails by not compiling. The futures are built in
//! functions that no test calls, so they are never polled.

use std::time::Duration;

use redsem::{
    CountDownLatch, Error, FencingToken, Holder, LatchOptions, LatchState, LeaseOptions,
    LeasePermit, LeaseSemaphore, MetricNames, Mutex, MutexGuard, PermitId, PermitOptions,
    PermitSemaphore, Redsem, RedsemOptions, ReplicaAcks, ServerChecks, ServerFinding, Status,
    Verdict, Waiter,
};

/// Compiles only if `T` is `Send + Sync`.
fn send_sync<T: Send + Sync>() {}

/// Compiles only if every type named is `Send + Sync + 'static`: a value that may go into
/// `tokio::spawn`, or into an `Arc` shared with one.
macro_rules! send_sync_static {
    ($($t:ty),+ $(,)?) => {
        $(send_sync::<$t>();)+
        $(is_static::<$t>();)+
    };
}

/// Compiles only if `T` is `'static`.
fn is_static<T: 'static>() {}

/// Compiles only if the future (or any value) is `Send`.
fn send<T: Send>(_: &T) {}

/// Compiles only if `tokio::spawn` would take the future.
fn spawnable<F: Future + Send + 'static>(_: F) {}

#[test]
fn the_client_the_primitives_and_their_permits_are_send_and_sync() {
    send_sync_static!(
        Redsem,
        LeaseSemaphore,
        LeasePermit,
        Mutex,
        MutexGuard,
        PermitSemaphore,
        CountDownLatch
    );
}

#[test]
fn options_status_and_value_types_are_send_and_sync() {
    send_sync_static!(
        RedsemOptions,
        LeaseOptions,
        PermitOptions,
        LatchOptions,
        ReplicaAcks,
        ServerChecks,
        ServerFinding,
        Verdict,
        Status,
        Holder,
        Waiter,
        LatchState,
        FencingToken,
        PermitId,
        MetricNames
    );
}

#[test]
fn the_error_is_send_sync_and_static() {
    // What `Box<dyn std::error::Error + Send + Sync>` and `anyhow::Error` need.
    fn boxable<E: std::error::Error + Send + Sync + 'static>() {}
    boxable::<Error>();
    send_sync::<redsem::Result<()>>();
}

#[cfg(feature = "blocking")]
#[test]
fn the_blocking_types_are_send_and_sync() {
    use redsem::blocking;
    send_sync_static!(
        blocking::Redsem,
        blocking::LeaseSemaphore,
        blocking::LeasePermit,
        blocking::Mutex,
        blocking::MutexGuard,
        blocking::PermitSemaphore,
        blocking::CountDownLatch
    );
}

/// Every future of the client. Built, never polled.
#[allow(dead_code)]
fn client_futures_are_send(redsem: &Redsem) {
    send(&Redsem::connect("redis://127.0.0.1/"));
    send(&Redsem::connect_with(
        "redis://127.0.0.1/",
        RedsemOptions::default(),
    ));
    send(&Redsem::connect_cluster(&["redis://127.0.0.1/"]));
    send(&Redsem::connect_cluster_with(
        &["redis://127.0.0.1/"],
        RedsemOptions::default(),
    ));
    send(&Redsem::connect_sentinel(
        &["redis://127.0.0.1:26379/"],
        "mymaster",
    ));
    send(&Redsem::connect_sentinel_with(
        &["redis://127.0.0.1:26379/"],
        "mymaster",
        RedsemOptions::default(),
    ));
    send(&redsem.check_server());
    send(&redsem.lease_semaphore_names());
    send(&redsem.flush());
}

/// Every future of the lease semaphore and its permit. Built, never polled.
#[allow(dead_code)]
fn lease_futures_are_send(sem: &LeaseSemaphore, permit: LeasePermit, id: &PermitId) {
    let wait = Duration::from_secs(1);
    send(&sem.try_acquire());
    send(&sem.try_acquire_many(2));
    send(&sem.acquire());
    send(&sem.acquire_many(2));
    send(&sem.acquire_timeout(wait));
    send(&sem.acquire_many_timeout(2, wait));
    send(&sem.acquire_with_progress(1, Some(wait), |_ahead| {}));
    send(&sem.status());
    send(&sem.set_capacity(3));
    send(&sem.refresh_id(id, wait));
    send(&sem.release_id(id));
    send(&permit.lost());
    send(&permit.refresh());
    send(&permit.release());
}

/// What a task does with its own handle: acquire, then release. Built, never polled.
#[allow(dead_code)]
fn a_task_with_its_own_handle_can_be_spawned(sem: LeaseSemaphore, permits: PermitSemaphore) {
    spawnable(async move { sem.acquire().await?.release().await });
    spawnable(async move { permits.acquire(1).await });
}

/// Every future of the mutex and its guard. Built, never polled.
#[allow(dead_code)]
fn mutex_futures_are_send(mutex: &Mutex, guard: MutexGuard) {
    send(&mutex.lock());
    send(&mutex.try_lock());
    send(&mutex.lock_timeout(Duration::from_secs(1)));
    send(&guard.unlock());
}

/// Every future of the permit semaphore. Built, never polled.
#[allow(dead_code)]
fn permit_semaphore_futures_are_send(sem: &PermitSemaphore) {
    send(&sem.try_set_permits(3));
    send(&sem.ensure_permits(3));
    send(&sem.add_permits(-1));
    send(&sem.release(1));
    send(&sem.try_acquire(1));
    send(&sem.acquire(1));
    send(&sem.acquire_timeout(1, Duration::from_secs(1)));
    send(&sem.available_permits());
    send(&sem.drain_permits());
    send(&sem.delete());
}

/// Every future of the countdown latch. Built, never polled.
#[allow(dead_code)]
fn latch_futures_are_send(latch: &CountDownLatch) {
    send(&latch.try_set_count(3));
    send(&latch.count_down());
    send(&latch.count());
    send(&latch.state());
    send(&latch.wait());
    send(&latch.wait_timeout(Duration::from_secs(1)));
    send(&latch.delete());
}
