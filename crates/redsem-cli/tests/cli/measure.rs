use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redsem::{PermitId, Redsem, RedsemOptions};

use crate::support::{World, finish};

/// Time from a release to a waiting `redsem run` starting its command: the command prints the
/// wall clock (`date +%s%N`) as it starts; the release is sent from this process.
#[test]
fn release_to_a_waiting_run_starting_its_command() {
    const TRIALS: usize = 50;
    let world = World::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let redsem = runtime
        .block_on(Redsem::connect_with(
            &world.server.url(),
            RedsemOptions::default(),
        ))
        .expect("connect");
    let sem = redsem.lease_semaphore("measure", 1).expect("semaphore");

    let mut samples = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let holder = world.acquire("measure", 1, &["--lease", "30s"]);
        let running = world.start(&["run", "measure", "--limit", "1", "--", "date", "+%s%N"]);
        world.wait_for_waiters("measure", 1);
        let sent = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970");
        redsem_test_release(&runtime, &sem, &holder);
        let out = running.wait().success();
        let started: u64 = out.stdout.trim().parse().expect("nanoseconds from date");
        samples.push(Duration::from_nanos(started).saturating_sub(sent));
    }
    samples.sort();
    println!(
        "release → waiting `redsem run` starts its command: median {:?} (min {:?}, max {:?}, {TRIALS} trials)",
        samples[TRIALS / 2],
        samples[0],
        samples[TRIALS - 1]
    );
    // The figure is not asserted; the run itself must have worked every time.
    finish(world.redsem(&["status", "measure"])).success();
}

fn redsem_test_release(runtime: &tokio::runtime::Runtime, sem: &redsem::LeaseSemaphore, id: &str) {
    runtime
        .block_on(sem.release_id(&PermitId::new(id)))
        .expect("release");
}
