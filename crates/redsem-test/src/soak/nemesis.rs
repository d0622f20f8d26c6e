//! The nemesis: faults on a seeded schedule, each recorded with the time it was in force.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redsem_test::{FaultProxy, RedisServer};

use super::history::{Fault, Record};
use super::ops::Recorder;
use super::rng::Rng;

/// Every kind of fault, in the order of the summary.
pub const KINDS: &[&str] = &[
    "kill",
    "cut",
    "drop_reply",
    "delay",
    "freeze",
    "frozen_client",
    "pause",
    "sleep",
    "restart",
    "lose_state",
];

pub struct Nemesis {
    pub rng: Rng,
    pub rec: Arc<Recorder>,
    pub proxies: Arc<Vec<FaultProxy>>,
    pub lease: Duration,
    /// Lease semaphore names whose state `lose_state` may delete (volatile deployment only).
    pub lose_names: Vec<String>,
    pub volatile: bool,
}

fn redis_con(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let _ = con.set_read_timeout(Some(Duration::from_secs(5)));
    Some(con)
}

impl Nemesis {
    /// Inject faults until `until`; returns how many of each kind.
    pub fn run(&mut self, server: &mut RedisServer, until: Instant) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        loop {
            let gap = Duration::from_millis(500 + self.rng.below(2500));
            if Instant::now() + gap >= until {
                break;
            }
            thread::sleep(gap);
            let mut kinds: Vec<&str> = KINDS.to_vec();
            if !self.volatile {
                kinds.retain(|k| *k != "lose_state");
            }
            let kind = kinds[self.rng.below(kinds.len() as u64) as usize];
            let client = self.rng.below(self.proxies.len() as u64) as usize;
            let proxy = &self.proxies[client];
            let mut target = "server".to_owned();
            let start = self.rec.now();
            match kind {
                "kill" => {
                    if let Some(mut con) = redis_con(server.port()) {
                        for ty in ["normal", "pubsub"] {
                            let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                                .arg("KILL")
                                .arg("TYPE")
                                .arg(ty)
                                .arg("SKIPME")
                                .arg("yes")
                                .query(&mut con);
                        }
                    }
                }
                "cut" => {
                    target = format!("client{client}");
                    proxy.cut_all();
                }
                "drop_reply" => {
                    target = format!("client{client}");
                    let before = proxy.triggered();
                    proxy.drop_reply_after(b"FCALL");
                    let deadline = Instant::now() + Duration::from_secs(1);
                    while proxy.triggered() == before && Instant::now() < deadline {
                        thread::sleep(Duration::from_millis(2));
                    }
                    // A pattern that has not fired is replaced by one that never will.
                    proxy.drop_reply_after(b"\x00never\x00");
                }
                "delay" => {
                    target = format!("client{client}");
                    proxy.set_delay(Duration::from_millis(10 + self.rng.below(150)));
                    thread::sleep(Duration::from_millis(300 + self.rng.below(1200)));
                    proxy.set_delay(Duration::ZERO);
                }
                "freeze" | "frozen_client" => {
                    target = format!("client{client}");
                    let span = if kind == "freeze" {
                        Duration::from_millis(100 + self.rng.below(400))
                    } else {
                        // Longer than a lease: its holders must learn they lost.
                        self.lease + self.lease / 2 + Duration::from_millis(self.rng.below(500))
                    };
                    proxy.set_frozen(true);
                    thread::sleep(span);
                    proxy.set_frozen(false);
                }
                "pause" => {
                    let ms = 100 + self.rng.below(700);
                    if let Some(mut con) = redis_con(server.port()) {
                        let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                            .arg("PAUSE")
                            .arg(ms)
                            .arg("ALL")
                            .query(&mut con);
                    }
                    thread::sleep(Duration::from_millis(ms));
                }
                "sleep" => {
                    let secs = 0.1 + self.rng.below(700) as f64 / 1000.0;
                    if let Some(mut con) = redis_con(server.port()) {
                        let _: redis::RedisResult<()> =
                            redis::cmd("DEBUG").arg("SLEEP").arg(secs).query(&mut con);
                    }
                }
                "restart" => server.restart(),
                "lose_state" => {
                    let name =
                        &self.lose_names[self.rng.below(self.lose_names.len() as u64) as usize];
                    target.clone_from(name);
                    if let Some(mut con) = redis_con(server.port()) {
                        let keys: Vec<String> = redis::cmd("KEYS")
                            .arg(format!("redsem:{{lease:{name}}}*"))
                            .query(&mut con)
                            .unwrap_or_default();
                        if !keys.is_empty() {
                            let _: redis::RedisResult<i64> =
                                redis::cmd("DEL").arg(keys).query(&mut con);
                        }
                    }
                }
                _ => unreachable!("unknown fault kind {kind}"),
            }
            let end = self.rec.now();
            self.rec.push(Record::Fault(Fault {
                kind: kind.to_owned(),
                target,
                start_us: start,
                end_us: end,
            }));
            *counts.entry(kind.to_owned()).or_insert(0) += 1;
        }
        counts
    }
}
