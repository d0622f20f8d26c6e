//! The nemesis: faults on a seeded schedule, each recorded with the time it was in force.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redsem_test::FaultProxy;

use super::Deployment;
use super::history::{Fault, Record};
use super::task::{EDGE_LEASE, EdgeGate, Recorder};
use redsem_verify::rng::Rng;

/// Every kind of fault, in the order of the summary.
pub const KINDS: &[&str] = &[
    "kill",
    "cut",
    "drop_reply",
    "drop_count_down",
    "delay",
    "freeze",
    "frozen_client",
    "frozen_runtime",
    "pause",
    "sleep",
    "restart",
    "lose_state",
    "rollback",
    "failover",
];

/// Faults on a client's proxy: not in a Sentinel deployment, whose clients reach the primary
/// at the address the Sentinels name.
const PROXY_KINDS: &[&str] = &[
    "cut",
    "drop_reply",
    "drop_count_down",
    "delay",
    "freeze",
    "frozen_client",
];

/// The fewest seconds between two failovers: after one, every change fails (`NotReplicated`)
/// until the old primary follows the new one (about 10 s), and a Sentinel refuses a second
/// failover of the same primary for 8 s.
const FAILOVER_GAP: Duration = Duration::from_secs(20);

pub struct Nemesis {
    pub rng: Rng,
    pub rec: Arc<Recorder>,
    pub proxies: Arc<Vec<FaultProxy>>,
    /// Each client's runtime (one thread each), for `frozen_runtime`.
    pub runtimes: Vec<tokio::runtime::Handle>,
    pub lease: Duration,
    /// Lease semaphore names whose state `lose_state` may delete (volatile deployment only).
    pub lose_names: Vec<String>,
    /// `single`, `volatile` or `sentinel`.
    pub deployment: String,
    /// Where a `stall` edge hold asks for its `lease_end` fault.
    pub edges: Arc<EdgeGate>,
    /// State losses of one lease semaphore (`lose_state`, `rollback`) beside a
    /// server with AOF too, and lost replies aimed at a latch count-down (`drop_count_down`).
    pub state_losses: bool,
    /// Whether each client asked for the native engine: its calls are `REDSEM.<OP>`
    /// commands, not `FCALL`s, which the lost-reply faults look for.
    pub native: Vec<bool>,
}

/// What a lost-reply fault waits for in a client's requests: its next call (`FCALL`, or a
/// module command), or its next count-down (the Lua function `<library>_latch_count_down`,
/// or the module's `REDSEM.LATCH_COUNT_DOWN`; the proxy matches bytes as they are).
fn call_pattern(native: bool, count_down: bool) -> &'static [u8] {
    match (native, count_down) {
        (false, false) => b"FCALL",
        (false, true) => b"latch_count_down",
        (true, false) => b"REDSEM.",
        (true, true) => b"REDSEM.LATCH_COUNT_DOWN",
    }
}

/// The keys of lease semaphore `name` (crates/redsem/src/keys.rs, the default prefix).
fn lease_keys(name: &str) -> [String; 6] {
    ["leases", "queue", "state", "slots", "tenants", "tqueue"]
        .map(|part| format!("redsem:{{lease:{name}}}:{part}"))
}

/// A copy of one key: `DUMP` (`None`: no key) and `PTTL`.
type Saved = (Option<Vec<u8>>, i64);

/// `rollback`: the keys of a lease semaphore copied in one transaction (`DUMP`), `lag` later
/// put back as they were (`DEL` and `RESTORE ... REPLACE` in one transaction), as a failover
/// to a replica that missed the writes of the last `lag` would: its grants, releases and
/// tokens since are lost, its holders and waiters of then are back.
///
/// The copy is taken at a moment nobody waits (tried every 2 ms for up to 0.5 s), so that
/// the first grant after the rollback may take the fast path, which reads the last token
/// of the copy (a replica's lag is as likely to fall there as anywhere).
fn roll_back(con: &mut redis::Connection, name: &str, lag: Duration) {
    let keys = lease_keys(name);
    let mut copy = redis::pipe();
    copy.atomic().cmd("HGET").arg(&keys[2]).arg("qlen");
    for key in &keys {
        copy.cmd("DUMP").arg(key).cmd("PTTL").arg(key);
    }
    let deadline = Instant::now() + Duration::from_millis(500);
    let saved: Vec<Saved> = loop {
        // The transaction's replies come as one flat list: qlen, then DUMP and PTTL per key.
        let Ok(replies) = copy.query::<Vec<redis::Value>>(con) else {
            return;
        };
        let Some((qlen, rest)) = replies.split_first() else {
            return;
        };
        let qlen: Option<String> = redis::from_redis_value_ref(qlen).unwrap_or(None);
        let saved: Option<Vec<Saved>> = rest
            .chunks(2)
            .map(|pair| {
                Some((
                    redis::from_redis_value_ref(pair.first()?).ok()?,
                    redis::from_redis_value_ref(pair.get(1)?).ok()?,
                ))
            })
            .collect();
        let Some(saved) = saved.filter(|s| s.len() == keys.len()) else {
            return;
        };
        if qlen.is_none_or(|q| q == "0") || Instant::now() >= deadline {
            break saved;
        }
        thread::sleep(Duration::from_millis(2));
    };
    thread::sleep(lag);
    let mut back = redis::pipe();
    back.atomic().cmd("DEL").arg(&keys[..]);
    for (key, (dump, pttl)) in keys.iter().zip(saved) {
        if let Some(dump) = dump {
            // A key that had a TTL (an idle semaphore's) gets what was left of it then.
            back.cmd("RESTORE")
                .arg(key)
                .arg(pttl.max(0))
                .arg(dump)
                .arg("REPLACE")
                .ignore();
        }
    }
    let _: redis::RedisResult<()> = back.ignore().query(con);
}

fn redis_con(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let _ = con.set_read_timeout(Some(Duration::from_secs(5)));
    Some(con)
}

/// How many replicas the server on `port` lists as connected (0 if it does not answer).
fn connected_replicas(port: u16) -> usize {
    let Some(mut con) = redis_con(port) else {
        return 0;
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

impl Nemesis {
    /// Sleep for `gap`, aiming a `lease_end` fault at each `stall` edge hold that begins
    /// meanwhile (most of them; only where clients have proxies).
    fn quiet(&mut self, gap: Duration) {
        let end = Instant::now() + gap;
        while Instant::now() < end {
            thread::sleep(Duration::from_millis(2));
            if self.proxies.is_empty() {
                continue;
            }
            if let Some(client) = self.edges.take_stall()
                && self.rng.chance(0.8)
            {
                self.lease_end(client as usize);
            }
        }
    }

    /// `lease_end`: a client holding a `stall` edge hold (kept alive, under the edge lease)
    /// has its proxy forward nothing from 0–150 ms into the hold until well past a lease: its
    /// renewals stop, so the lease ends on the server while the holder still believes it
    /// holds, and the hold's approach probes that end. Half the time the freeze follows
    /// 50–150 ms in which every chunk is delayed by 5–45 ms (the last renewals arrive late,
    /// each still within a third of the lease): a local validity counted from a renewal's
    /// reply instead of its sending would then outlast the lease by the delay.
    fn lease_end(&mut self, client: usize) {
        let proxy = &self.proxies[client];
        thread::sleep(Duration::from_millis(self.rng.below(150)));
        let start = self.rec.now();
        if self.rng.chance(0.5) {
            proxy.set_delay(Duration::from_millis(5 + self.rng.below(40)));
            thread::sleep(Duration::from_millis(50 + self.rng.below(100)));
            proxy.set_delay(Duration::ZERO);
        }
        proxy.set_frozen(true);
        thread::sleep(EDGE_LEASE + Duration::from_millis(20 + self.rng.below(200)));
        proxy.set_frozen(false);
        self.rec.push(Record::Fault(Fault {
            kind: "lease_end".into(),
            target: format!("client{client}"),
            start_us: start,
            end_us: self.rec.now(),
        }));
    }

    /// Inject faults until `until`, each recorded.
    pub fn run(&mut self, deployment: &mut Deployment, until: Instant) {
        let sentinel = self.deployment == "sentinel";
        // Faults on the server that must not look like a dead primary to the Sentinels
        // (`down-after-milliseconds` 1000) stay shorter there.
        let server_stall_ms = if sentinel { 500 } else { 800 };
        let mut last_failover: Option<Instant> = None;
        loop {
            let gap = Duration::from_millis(500 + self.rng.below(2500));
            if Instant::now() + gap >= until {
                break;
            }
            self.quiet(gap);
            let mut kinds: Vec<&str> = KINDS.to_vec();
            kinds.retain(|k| match *k {
                "lose_state" | "rollback" => {
                    self.deployment == "volatile" || (self.state_losses && !sentinel)
                }
                "failover" => sentinel && last_failover.is_none_or(|t| t.elapsed() >= FAILOVER_GAP),
                // Restarting a primary without persistence that replicas follow would empty
                // them all: not a deployment README describes.
                "restart" => !sentinel,
                "drop_count_down" => self.state_losses && self.deployment == "single",
                k if PROXY_KINDS.contains(&k) => !self.proxies.is_empty(),
                _ => true,
            });
            if kinds.contains(&"rollback") {
                // Three times as likely as the others: only a rollback whose first grant
                // after it takes the fast path shows that path's token (docs/SOAK.md).
                kinds.extend(["rollback", "rollback"]);
            }
            let kind = kinds[self.rng.below(kinds.len() as u64) as usize];
            let client = self.rng.below(self.runtimes.len() as u64) as usize;
            let mut target = "server".to_owned();
            let mut start = self.rec.now();
            let mut end = None;
            match kind {
                "kill" => {
                    if let Some(mut con) = redis_con(deployment.primary_port()) {
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
                    self.proxies[client].cut_all();
                }
                "drop_reply" | "drop_count_down" => {
                    target = format!("client{client}");
                    let proxy = &self.proxies[client];
                    let before = proxy.triggered();
                    // Aimed at a count-down: its resend must not count twice.
                    let count_down = kind == "drop_count_down";
                    let native = self.native.get(client).copied().unwrap_or(false);
                    proxy.drop_reply_after(call_pattern(native, count_down));
                    let wait = Duration::from_secs(if count_down { 3 } else { 1 });
                    let deadline = Instant::now() + wait;
                    while proxy.triggered() == before && Instant::now() < deadline {
                        thread::sleep(Duration::from_millis(2));
                    }
                    // A pattern that has not fired is replaced by one that never will.
                    proxy.drop_reply_after(b"\x00never\x00");
                }
                "delay" => {
                    target = format!("client{client}");
                    let proxy = &self.proxies[client];
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
                    let proxy = &self.proxies[client];
                    proxy.set_frozen(true);
                    thread::sleep(span);
                    proxy.set_frozen(false);
                }
                "frozen_runtime" => {
                    // The client's runtime thread blocked: its keep-alive, timers, pub/sub and
                    // tasks all stop, as a process under SIGSTOP. Up to about two leases.
                    target = format!("client{client}");
                    let span = Duration::from_millis(
                        self.rng
                            .below(u64::try_from(self.lease.as_millis() * 2).unwrap_or(2000)),
                    );
                    let (tx, rx) = std::sync::mpsc::channel();
                    let rec = Arc::clone(&self.rec);
                    drop(self.runtimes[client].spawn(async move {
                        let from = rec.now();
                        thread::sleep(span);
                        let _ = tx.send((from, rec.now()));
                    }));
                    match rx.recv_timeout(span + Duration::from_secs(10)) {
                        Ok((from, to)) => {
                            start = from;
                            end = Some(to);
                        }
                        // The runtime is gone (the run is ending): nothing was frozen.
                        Err(_) => continue,
                    }
                }
                "failover" => {
                    let Deployment::Sentinel(s) = deployment else {
                        unreachable!("failover outside a Sentinel deployment")
                    };
                    last_failover = Some(Instant::now());
                    // The kit panics when no failover completes within 30 s (a Sentinel may
                    // abort one, e.g. finding no replica good enough right after the last):
                    // the attempt is still recorded as a fault, and the nemesis goes on.
                    let attempt =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.failover()));
                    let Ok(new) = attempt else {
                        eprintln!("nemesis: a forced failover did not complete; going on");
                        self.rec.push(Record::Fault(Fault {
                            kind: kind.to_owned(),
                            target,
                            start_us: start,
                            end_us: self.rec.now(),
                        }));
                        continue;
                    };
                    // The fault lasts until the new primary has both replicas again: until
                    // then every change fails with `NotReplicated` (the old primary follows
                    // the new one about ten seconds later).
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < deadline && connected_replicas(new) < 2 {
                        thread::sleep(Duration::from_millis(50));
                    }
                }
                "pause" => {
                    let ms = 100 + self.rng.below(server_stall_ms - 100);
                    if let Some(mut con) = redis_con(deployment.primary_port()) {
                        let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                            .arg("PAUSE")
                            .arg(ms)
                            .arg("ALL")
                            .query(&mut con);
                    }
                    thread::sleep(Duration::from_millis(ms));
                }
                "sleep" => {
                    let secs = 0.1 + self.rng.below(server_stall_ms - 100) as f64 / 1000.0;
                    if let Some(mut con) = redis_con(deployment.primary_port()) {
                        let _: redis::RedisResult<()> =
                            redis::cmd("DEBUG").arg("SLEEP").arg(secs).query(&mut con);
                    }
                }
                "restart" => {
                    let Deployment::Single(server) = deployment else {
                        unreachable!("restart outside a single server")
                    };
                    server.restart();
                }
                "lose_state" => {
                    let name =
                        &self.lose_names[self.rng.below(self.lose_names.len() as u64) as usize];
                    target.clone_from(name);
                    if let Some(mut con) = redis_con(deployment.primary_port()) {
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
                "rollback" => {
                    let name =
                        &self.lose_names[self.rng.below(self.lose_names.len() as u64) as usize];
                    target.clone_from(name);
                    let lag = Duration::from_millis(50 + self.rng.below(400));
                    if let Some(mut con) = redis_con(deployment.primary_port()) {
                        roll_back(&mut con, name, lag);
                    }
                }
                _ => unreachable!("unknown fault kind {kind}"),
            }
            let end = end.unwrap_or_else(|| self.rec.now());
            self.rec.push(Record::Fault(Fault {
                kind: kind.to_owned(),
                target,
                start_us: start,
                end_us: end,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::call_pattern;

    #[test]
    fn lost_reply_patterns_are_the_bytes_each_engine_sends() {
        // What the proxy sees of a call: `FCALL <library>_<op> ...` or `REDSEM.<OP> ...`.
        let fcall = b"*5\r\n$5\r\nFCALL\r\n$36\r\nredsem_7de154df7c1d_latch_count_down\r\n";
        let native = b"*6\r\n$23\r\nREDSEM.LATCH_COUNT_DOWN\r\n$23\r\nredsem:{latch:l0}:state\r\n";
        let lease = b"*6\r\n$20\r\nREDSEM.LEASE_ACQUIRE\r\n";
        let has = |hay: &[u8], pat: &[u8]| hay.windows(pat.len()).any(|w| w == pat);
        assert!(has(fcall, call_pattern(false, false)));
        assert!(has(fcall, call_pattern(false, true)));
        assert!(has(native, call_pattern(true, false)));
        assert!(has(native, call_pattern(true, true)));
        assert!(has(lease, call_pattern(true, false)));
        assert!(!has(lease, call_pattern(true, true)));
        // The keys are lower case: no native pattern matches them.
        assert!(!has(b"redsem:{lease:a}:leases", call_pattern(true, false)));
    }
}
