//! What every scenario gets: the server URL, the admin connection, the sizes of this run, and
//! fresh key prefixes (each scenario writes under its own, and removes it when done).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redsem::{LeaseOptions, RedsemOptions};
use serde::Serialize;

use crate::BenchResult;
use crate::admin::Admin;
use crate::sem::{self, Polling, Seeds};

/// How big each scenario is.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sizes {
    /// S1 (and S7's S1): measuring time.
    pub(crate) s1_time: Duration,
    /// S2: task counts, client counts, measuring time per point.
    pub(crate) s2_tasks: Vec<usize>,
    pub(crate) s2_clients: Vec<usize>,
    pub(crate) s2_time: Duration,
    /// S2 with a hold: (tasks, clients) points, each holder sleeping `s2_hold` before it
    /// releases (the "64 tasks, capacity 8, hold 1 ms" point).
    pub(crate) s2_hold_points: Vec<(usize, usize)>,
    pub(crate) s2_hold: Duration,
    /// S3: hand-off trials.
    pub(crate) s3_trials: usize,
    /// S4: waiters.
    pub(crate) s4_waiters: usize,
    /// S5: live-holder levels, measuring time at each, waiting tasks.
    pub(crate) s5_levels: Vec<usize>,
    pub(crate) s5_time: Duration,
    pub(crate) s5_waiters: usize,
    /// S6: cycles watched, live holders, waiters and idle semaphores measured.
    pub(crate) s6_cycles: usize,
    pub(crate) s6_holders: usize,
    pub(crate) s6_waiters: usize,
    pub(crate) s6_idle: usize,
    /// S8: measuring time per point.
    pub(crate) s8_time: Duration,
    /// S10, many waiters: tasks, clients they are spread over, capacity, hold, measuring time
    /// (for redsem and again for the polling baseline).
    pub(crate) s10_tasks: usize,
    pub(crate) s10_clients: usize,
    pub(crate) s10_capacity: usize,
    pub(crate) s10_hold: Duration,
    pub(crate) s10_time: Duration,
    /// S11, steady state: measuring time (`--s11-seconds`), the window whose server time per
    /// cycle is compared (first against last), clients and tasks on each.
    pub(crate) s11_time: Duration,
    pub(crate) s11_window: Duration,
    pub(crate) s11_clients: usize,
    pub(crate) s11_tasks_per_client: usize,
    /// S12, noisy neighbour: tenant A's looping tasks (its backlog), tenant B's, capacity,
    /// hold, measuring time (for the plain FIFO and again for fair shares).
    pub(crate) s12_a_tasks: usize,
    pub(crate) s12_b_tasks: usize,
    pub(crate) s12_capacity: usize,
    pub(crate) s12_hold: Duration,
    pub(crate) s12_time: Duration,
}

impl Sizes {
    pub(crate) fn full() -> Sizes {
        Sizes {
            s1_time: Duration::from_secs(3),
            s2_tasks: vec![16, 64, 256],
            s2_clients: vec![1, 4],
            s2_time: Duration::from_secs(2),
            s2_hold_points: vec![(64, 1)],
            s2_hold: Duration::from_millis(1),
            s3_trials: 500,
            s4_waiters: 50,
            s5_levels: vec![10, 1_000, 100_000],
            s5_time: Duration::from_secs(1),
            s5_waiters: 10_000,
            s6_cycles: 200,
            s6_holders: 10_000,
            s6_waiters: 2_000,
            s6_idle: 1_000,
            s8_time: Duration::from_secs(1),
            s10_tasks: 1_000,
            s10_clients: 4,
            s10_capacity: 16,
            s10_hold: Duration::from_millis(20),
            s10_time: Duration::from_secs(10),
            s11_time: Duration::from_secs(60),
            s11_window: Duration::from_secs(10),
            s11_clients: 4,
            s11_tasks_per_client: 2,
            s12_a_tasks: 500,
            s12_b_tasks: 5,
            s12_capacity: 16,
            s12_hold: Duration::from_millis(20),
            s12_time: Duration::from_secs(10),
        }
    }

    pub(crate) fn smoke() -> Sizes {
        Sizes {
            s1_time: Duration::from_millis(200),
            s2_tasks: vec![16, 64],
            s2_clients: vec![1, 4],
            s2_time: Duration::from_millis(200),
            s2_hold_points: vec![(64, 1)],
            s2_hold: Duration::from_millis(1),
            s3_trials: 30,
            s4_waiters: 10,
            s5_levels: vec![10, 100, 1_000],
            s5_time: Duration::from_millis(100),
            s5_waiters: 300,
            s6_cycles: 20,
            s6_holders: 300,
            s6_waiters: 100,
            s6_idle: 30,
            s8_time: Duration::from_millis(100),
            s10_tasks: 40,
            s10_clients: 2,
            s10_capacity: 4,
            s10_hold: Duration::from_millis(5),
            s10_time: Duration::from_millis(250),
            s11_time: Duration::from_secs(1),
            s11_window: Duration::from_millis(250),
            s11_clients: 4,
            s11_tasks_per_client: 2,
            s12_a_tasks: 30,
            s12_b_tasks: 2,
            s12_capacity: 4,
            s12_hold: Duration::from_millis(5),
            s12_time: Duration::from_millis(300),
        }
    }
}

pub(crate) struct Ctx {
    pub(crate) url: String,
    pub(crate) admin: Admin,
    pub(crate) sizes: Sizes,
    run_id: String,
    /// `RedsemOptions::group_commit` of every redsem client made here.
    pub(crate) group_commit: bool,
}

impl Ctx {
    pub(crate) fn new(url: String, admin: Admin, sizes: Sizes) -> Ctx {
        Ctx {
            url,
            admin,
            sizes,
            run_id: format!("{:08x}", rand::random::<u32>()),
            group_commit: true,
        }
    }

    /// A key prefix of this run for `what`; every key of the scenario starts with it.
    pub(crate) fn prefix(&self, what: &str) -> String {
        format!("rsb-{}-{what}", self.run_id)
    }

    /// A new redsem client (its own command and pub/sub connections) under `prefix`.
    pub(crate) async fn redsem(&self, prefix: &str) -> BenchResult<redsem::Redsem> {
        Ok(redsem::Redsem::connect_with(
            &self.url,
            RedsemOptions::default()
                .prefix(prefix)
                .group_commit(self.group_commit),
        )
        .await?)
    }

    /// `clients` redsem clients, each with a handle on the lease semaphore `name`.
    pub(crate) async fn redsem_sems(
        &self,
        prefix: &str,
        name: &str,
        capacity: u32,
        options: LeaseOptions,
        clients: usize,
    ) -> BenchResult<Vec<sem::Redsem>> {
        let mut out = Vec::with_capacity(clients);
        for _ in 0..clients {
            let client = self.redsem(prefix).await?;
            out.push(sem::Redsem(client.lease_semaphore_with(
                name,
                capacity,
                options.clone(),
            )?));
        }
        Ok(out)
    }

    /// `clients` connections, each with a handle on the seeds' semaphore `name`.
    pub(crate) async fn seeds_sems(
        &self,
        prefix: &str,
        name: &str,
        limit: u64,
        clients: usize,
        round_trips: &Arc<AtomicU64>,
    ) -> BenchResult<Vec<Seeds>> {
        let key = format!("{prefix}:seeds:{name}");
        self.baseline_sems(Seeds::new, &key, limit, clients, round_trips)
            .await
    }

    /// `clients` connections, each with a handle on the polling semaphore `name`.
    pub(crate) async fn polling_sems(
        &self,
        prefix: &str,
        name: &str,
        limit: u64,
        clients: usize,
        round_trips: &Arc<AtomicU64>,
    ) -> BenchResult<Vec<Polling>> {
        let key = format!("{prefix}:polling:{name}");
        self.baseline_sems(Polling::new, &key, limit, clients, round_trips)
            .await
    }

    /// `clients` connections, each with a baseline's handle on `key` made by `new`.
    async fn baseline_sems<S>(
        &self,
        new: fn(MultiplexedConnection, &str, u64, Arc<AtomicU64>) -> S,
        key: &str,
        limit: u64,
        clients: usize,
        round_trips: &Arc<AtomicU64>,
    ) -> BenchResult<Vec<S>> {
        let mut out = Vec::with_capacity(clients);
        for _ in 0..clients {
            let conn = self.admin.client.get_multiplexed_async_connection().await?;
            out.push(new(conn, key, limit, round_trips.clone()));
        }
        Ok(out)
    }

    /// Remove every key under `prefix`.
    pub(crate) async fn clean(&self, prefix: &str) -> BenchResult<()> {
        self.admin.unlink(&format!("{prefix}:*")).await?;
        // The seeds' lock key is `lock:<semname>`.
        self.admin.unlink(&format!("lock:{prefix}:*")).await
    }
}
