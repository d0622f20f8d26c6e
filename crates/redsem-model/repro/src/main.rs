//! Reproduces the model's stale wake-up on the real library: a waiter's QUEUED reply is lost,
//! its process stalls (here: its runtime's thread blocks) after check_in decided to resend
//! and before the resend; meanwhile it is granted by wake-up, the grant runs out unclaimed and
//! another holder takes the unit; the resend is queued as a new request and the engine takes
//! the old wake-up, still in the mailbox of that id, as its grant.
//!
//! Exits 1 when two permits were held at once on the capacity-1 semaphore (the defect), 0 when
//! the waiter's acquire did not return a permit while the second holder held the unit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redsem::{LeaseOptions, Redsem, RedsemOptions};
use redsem_test::{FaultProxy, RedisServer};
use tracing::span;

/// Blocks the thread for `stall` at the first event check_in logs before a resend.
struct StallOnRetry {
    stall: Duration,
    fired: Arc<AtomicBool>,
}

impl tracing::Subscriber for StallOnRetry {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let file = event.metadata().file().unwrap_or("");
        if file.ends_with("check_in.rs") && !self.fired.swap(true, Ordering::SeqCst) {
            eprintln!(
                "{:?} waiter: check_in will resend; its thread stalls for {:?}",
                now(),
                self.stall
            );
            std::thread::sleep(self.stall);
            eprintln!("{:?} waiter: stall over", now());
        }
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
fn now() -> Duration {
    START.get_or_init(Instant::now).elapsed()
}

fn main() {
    now();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let options = LeaseOptions::default()
        .lease(Duration::from_secs(4))
        .waiter_lease(Duration::from_millis(600));
    let holders = rt.block_on(Redsem::connect(&server.url())).unwrap();
    let sem = holders
        .lease_semaphore_with("stale", 1, options.clone())
        .unwrap();
    let first = rt.block_on(sem.acquire()).unwrap();
    eprintln!(
        "{:?} holder: first permit, token {}",
        now(),
        first.token().get()
    );

    let fired = Arc::new(AtomicBool::new(false));
    let stalled = fired.clone();
    let url = proxy.url();
    proxy.drop_reply_after(b"_lease_acquire");
    let waiter = std::thread::spawn(move || {
        let _guard = tracing::subscriber::set_default(StallOnRetry {
            stall: Duration::from_millis(2000),
            fired,
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let opts = RedsemOptions::default().response_timeout(Duration::from_millis(300));
            let redsem = Redsem::connect_with(&url, opts).await.unwrap();
            let sem = redsem.lease_semaphore_with("stale", 1, options).unwrap();
            let permit = tokio::time::timeout(Duration::from_secs(8), sem.acquire()).await;
            match permit {
                Ok(Ok(permit)) => {
                    let report = (permit.token().get(), permit.is_held(), permit.time_left(), permit.id().to_string());
                    eprintln!("{:?} waiter: acquire returned a permit, token {}, is_held {}, time left {:?}", now(), report.0, report.1, report.2);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    eprintln!("{:?} waiter: 100 ms later is_held {}, is_lost {}", now(), permit.is_held(), permit.is_lost());
                    Some(report)
                }
                other => {
                    eprintln!("{:?} waiter: acquire ended {other:?}", now());
                    None
                }
            }
        })
    });

    // Wait for the stall, then release: the waiter is granted by wake-up (unclaimed).
    while !stalled.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "{:?} holder: proxy dropped {} reply; releasing",
        now(),
        proxy.triggered()
    );
    rt.block_on(first.release()).unwrap();
    let status = rt.block_on(sem.status()).unwrap();
    eprintln!(
        "{:?} status after release: holders {:?}",
        now(),
        status
            .holders
            .iter()
            .map(|h| h.id.to_string())
            .collect::<Vec<_>>()
    );
    // Past the waiter lease: the unclaimed grant runs out; a second holder takes the unit.
    std::thread::sleep(Duration::from_millis(900));
    let second = rt.block_on(sem.acquire()).unwrap();
    eprintln!(
        "{:?} holder: second permit, token {}",
        now(),
        second.token().get()
    );
    let report = waiter.join().unwrap();
    let status = rt.block_on(sem.status()).unwrap();
    eprintln!(
        "{:?} holder: second permit is_held {}; server holders {:?} waiters {:?}",
        now(),
        second.is_held(),
        status
            .holders
            .iter()
            .map(|h| h.id.to_string())
            .collect::<Vec<_>>(),
        status
            .waiters
            .iter()
            .map(|w| w.id.to_string())
            .collect::<Vec<_>>()
    );
    let reproduced = match report {
        Some((token, held, _, id)) if held && second.is_held() => {
            println!(
                "REPRODUCED: capacity 1, two permits held at once: the second holder's token {} and the waiter's {} (id {id}, from a stale wake-up)",
                second.token().get(),
                token
            );
            true
        }
        other => {
            println!("not reproduced: {other:?}");
            false
        }
    };
    rt.block_on(second.release()).unwrap();
    std::process::exit(if reproduced { 1 } else { 0 });
}
