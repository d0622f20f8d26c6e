//! The seeded sequences of calls a differential run sends to both engines: every operation
//! of the three primitives, from several client sessions, with lost replies and their
//! resends, late copies, withdrawals of unanswered calls, capacity changes, time moved on
//! (leases, waiter leases and session records expire) and faults (a foreign value at one of
//! the keys, keys lost).
//!
//! The generator keeps a rough picture of what each semaphore holds, learnt from the first
//! engine's replies, only to pick ids that exist more often than not: the runner compares
//! whatever the calls are, so the picture needs no precision.

use std::collections::BTreeSet;

use redis::Value;

use crate::rng::Rng;

/// A primitive: the Lua prefix of its operations and its keys, in KEYS order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// The lease semaphore (and the mutex, a lease semaphore of capacity 1).
    Lease,
    /// The permit semaphore.
    Permit,
    /// The countdown latch.
    Latch,
}

impl Primitive {
    /// Its keys' names, in KEYS order (as its prelude lists them).
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Primitive::Lease => &["leases", "queue", "state", "slots", "tenants", "tqueue"],
            Primitive::Permit => &["count", "queue", "waiters", "records", "meta", "sessions"],
            Primitive::Latch => &["count", "done", "applied", "sessions"],
        }
    }

    /// Whether key `index` is a string (a foreign value there is then a list).
    fn string_key(self, index: usize) -> bool {
        matches!(
            (self, index),
            (Primitive::Lease, 3) | (Primitive::Permit, 0) | (Primitive::Latch, 0 | 1)
        )
    }

    fn tag(self) -> &'static str {
        match self {
            Primitive::Lease => "lease",
            Primitive::Permit => "permit",
            Primitive::Latch => "latch",
        }
    }
}

/// Stands for the engine's side in keys, channels and ids: each engine works on its own
/// copy of every key (see [`Step::keys`]).
pub const SIDE: &str = "~S~";

/// A fault applied to both engines' keys around one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A value of another type at key `index` while the step runs; the key's own value is
    /// put back after it.
    Foreign(usize),
    /// Key `index` deleted before the step (evicted, lost in a failover).
    Lose(usize),
    /// Every key of the semaphore deleted before the step.
    LoseAll,
    /// The string at key `index` (a count, the slot bitmap, the latch's marker) replaced by
    /// [`ODD_TEXTS`]`[which]`, a text that is no count as the scripts write one, while the
    /// step runs; put back after it.
    OddText(usize, usize),
}

/// Texts a string key may hold that the scripts never write: an integer written another way
/// (a leading zero, a sign, an exponent, a space), one past the exact range, or no number (an
/// empty text, a lone sign, letters).
pub const ODD_TEXTS: [&str; 10] = [
    "007",
    "-0",
    "+5",
    "1e3",
    " 5",
    "abc",
    "9007199254740992",
    "99999999999999999999",
    "",
    "-",
];

/// One call, as both engines get it.
#[derive(Debug, Clone)]
pub struct Step {
    /// Its primitive.
    pub primitive: Primitive,
    /// Which semaphore of that primitive.
    pub sem: usize,
    /// The operation (a Lua file's name).
    pub op: &'static str,
    /// Its ARGV, with [`SIDE`] where the engine's side goes.
    pub args: Vec<String>,
    /// The client that sends it.
    pub client: usize,
    /// The session numbers it carries (answered when its reply arrives).
    pub seqs: Vec<u64>,
    /// Its reply is lost: the client does not learn it (and may send it again).
    pub lost: bool,
    /// It is a resend (or a late copy) of an earlier call.
    pub resend: bool,
    /// How far the clock moves on before it, in µs.
    pub advance_us: u64,
    /// A fault around it, if any.
    pub fault: Option<Fault>,
}

impl Step {
    /// A call of `op` by `client` on semaphore `sem`, carrying the session numbers `seqs`;
    /// its reply arrives, no fault, the clock not moved (the generator decides those after).
    fn new(
        primitive: Primitive,
        sem: usize,
        op: &'static str,
        args: Vec<String>,
        client: usize,
        seqs: Vec<u64>,
    ) -> Step {
        Step {
            primitive,
            sem,
            op,
            args,
            client,
            seqs,
            lost: false,
            resend: false,
            advance_us: 0,
            fault: None,
        }
    }

    /// Its KEYS, with [`SIDE`] where the engine's side goes.
    pub fn keys(&self) -> Vec<String> {
        semaphore_keys(self.primitive, self.sem)
    }

    /// One line for a divergence report.
    pub fn describe(&self) -> String {
        format!(
            "{} #{} client {}{}{}{} {:?}",
            self.op,
            self.sem,
            self.client,
            if self.resend { " (resent)" } else { "" },
            if self.lost { " (reply lost)" } else { "" },
            self.fault
                .map(|f| format!(" fault {f:?}"))
                .unwrap_or_default(),
            self.args
        )
    }
}

/// The keys of semaphore `sem` of `primitive`, with [`SIDE`] in their hash tag.
pub fn semaphore_keys(primitive: Primitive, sem: usize) -> Vec<String> {
    primitive
        .keys()
        .iter()
        .map(|name| format!("{{{SIDE}:{}{sem}}}:{name}", primitive.tag()))
        .collect()
}

/// How many semaphores of each primitive a run uses.
pub const SEMAPHORES: usize = 2;

#[derive(Debug)]
struct Client {
    session: String,
    next_seq: u64,
    /// Numbers sent and not answered (nor given up): the low mark is the least of them.
    open: BTreeSet<u64>,
    /// Calls whose reply was lost: resent, withdrawn or given up later.
    lost: Vec<Step>,
    /// Calls given up: a late copy of one may still arrive.
    late: Vec<Step>,
}

impl Client {
    fn seq(&mut self) -> String {
        self.next_seq += 1;
        self.open.insert(self.next_seq);
        hex(self.next_seq)
    }

    fn low(&self) -> String {
        hex(self.open.first().copied().unwrap_or(self.next_seq + 1))
    }

    fn channel(&self, index: usize) -> String {
        format!("{SIDE}:wake:c{index}")
    }
}

fn hex(n: u64) -> String {
    format!("{n:x}")
}

#[derive(Debug, Default)]
struct Picture {
    /// Lease semaphores: capacity asked for.
    cap: u64,
    /// Ids granted (as far as the first engine's replies said).
    holders: Vec<(String, u64)>,
    /// Ids queued, with the number of the call that queued them.
    waiters: Vec<(String, u64)>,
    /// Ids seen once: released, withdrawn, gone.
    old: Vec<String>,
    /// Ids granted while they waited (woken by a message): their check-in collects it.
    woken: Vec<String>,
}

/// The generator of a run's steps.
#[derive(Debug)]
pub struct Generator {
    rng: Rng,
    clients: Vec<Client>,
    pictures: Vec<Picture>,
    next_id: u64,
}

// (An hour: a lease that outlives a client session's record, so a record falls due for
// pruning while the lease is held and no lease end is due.)
const LEASES: [u64; 5] = [200, 1_000, 5_000, 30_000, 3_600_000];
const WAITER_LEASES: [u64; 2] = [300, 2_000];

impl Generator {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Generator {
        let mut rng = Rng::new(seed);
        let clients = (0..4)
            .map(|i| Client {
                session: format!("{:x}{i}", rng.next_u64() >> 16),
                next_seq: 0,
                open: BTreeSet::new(),
                lost: Vec::new(),
                late: Vec::new(),
            })
            .collect();
        let pictures = (0..3 * SEMAPHORES)
            .map(|_| Picture {
                cap: 2,
                ..Picture::default()
            })
            .collect();
        Generator {
            rng,
            clients,
            pictures,
            next_id: 0,
        }
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.rng.below(from.len() as u64) as usize]
    }

    fn id(&mut self) -> String {
        self.next_id += 1;
        format!("q{}", self.next_id)
    }

    fn picture(&mut self, primitive: Primitive, sem: usize) -> &mut Picture {
        let base = match primitive {
            Primitive::Lease => 0,
            Primitive::Permit => SEMAPHORES,
            Primitive::Latch => 2 * SEMAPHORES,
        };
        &mut self.pictures[base + sem]
    }

    /// An id of the semaphore's picture: mostly a holder or a waiter, sometimes an old or an
    /// unknown one.
    fn some_id(&mut self, primitive: Primitive, sem: usize, holder: bool) -> String {
        let roll = self.rng.below(10);
        let picture = self.picture(primitive, sem);
        let (holders, waiters, old, woken) = (
            picture.holders.clone(),
            picture.waiters.clone(),
            picture.old.clone(),
            picture.woken.clone(),
        );
        if roll < 8 {
            let from: Vec<String> = if holder {
                holders.into_iter().map(|(id, _)| id).collect()
            } else if roll < 4 && !woken.is_empty() {
                woken
            } else {
                waiters.into_iter().map(|(id, _)| id).collect()
            };
            if !from.is_empty() {
                return from[self.rng.below(from.len() as u64) as usize].clone();
            }
        }
        if roll < 9 && !old.is_empty() {
            return old[self.rng.below(old.len() as u64) as usize].clone();
        }
        self.id()
    }

    /// The next step.
    pub fn next_step(&mut self) -> Step {
        let client = self.rng.below(self.clients.len() as u64) as usize;
        let mut step = if !self.clients[client].lost.is_empty() && self.rng.chance(0.3) {
            self.after_lost(client)
        } else if !self.clients[client].late.is_empty() && self.rng.chance(0.03) {
            let late = &mut self.clients[client].late;
            let at = self.rng.below(late.len() as u64) as usize;
            let mut step = late.swap_remove(at);
            step.resend = true;
            step
        } else {
            let sem = self.rng.below(SEMAPHORES as u64) as usize;
            match self.rng.below(10) {
                0..=4 => self.lease(client, sem),
                5..=7 => self.permit(client, sem),
                _ => self.latch(client, sem),
            }
        };
        step.lost = !step.seqs.is_empty() && self.rng.chance(0.08);
        step.advance_us = match self.rng.below(1000) {
            // The same microsecond: a token then comes from the last one, not the clock.
            0..=99 => 0,
            100..=699 => self.rng.below(3_000),
            700..=949 => 10_000 + self.rng.below(490_000),
            950..=994 => 1_000_000 + self.rng.below(40_000_000),
            // Past a session record's life (10 min) and its pruning lag.
            _ => 605_000_000 + self.rng.below(20_000_000),
        };
        step.fault = match self.rng.below(200) {
            0..=2 => Some(Fault::Foreign(
                self.rng.below(step.primitive.keys().len() as u64) as usize,
            )),
            3 => Some(Fault::Lose(
                self.rng.below(step.primitive.keys().len() as u64) as usize,
            )),
            4 => Some(Fault::LoseAll),
            5..=6 => {
                let strings: Vec<usize> = (0..step.primitive.keys().len())
                    .filter(|&i| step.primitive.string_key(i))
                    .collect();
                let index = self.pick(&strings);
                Some(Fault::OddText(
                    index,
                    self.rng.below(ODD_TEXTS.len() as u64) as usize,
                ))
            }
            _ => None,
        };
        step
    }

    /// A step about a call of `client` whose reply was lost: resend it, withdraw it (a
    /// cancelled wait) or give it up (a late copy may come later).
    fn after_lost(&mut self, client: usize) -> Step {
        let lost = &mut self.clients[client].lost;
        let at = self.rng.below(lost.len() as u64) as usize;
        let step = lost.swap_remove(at);
        let roll = self.rng.below(10);
        let enqueue = matches!(step.op, "lease_acquire" | "permit_acquire")
            && step.args.iter().any(|a| a == "wait");
        if roll < 6 {
            let mut again = step;
            again.resend = true;
            return again;
        }
        // Given up: its numbers leave the open set; it may still arrive late.
        let c = &mut self.clients[client];
        for seq in &step.seqs {
            c.open.remove(seq);
        }
        let (primitive, sem, id, seq) =
            (step.primitive, step.sem, step.args[0].clone(), step.seqs[0]);
        c.late.push(step);
        if enqueue && roll < 9 {
            // The cancelled wait withdraws the request, naming the unanswered enqueue.
            return match primitive {
                Primitive::Lease => self.lease_release(client, sem, id, Some(seq)),
                _ => self.permit_withdraw(client, sem, id, Some(seq)),
            };
        }
        let sem = self.rng.below(SEMAPHORES as u64) as usize;
        self.lease(client, sem)
    }

    /// The tenant, weight and cap of a lease request (lua/lease/tenants.lua): on the first
    /// semaphore none (its state never takes the tenants' layout: the native engine's general
    /// paths, which decline it, keep a semaphore to serve); on the others mostly none (the
    /// default tenant), else one of three tenants, each with its own weight and cap, now and
    /// then with another weight (a conflict while it is live) or a setting the default
    /// tenant refuses.
    fn lease_tenant(&mut self, sem: usize) -> [String; 3] {
        if sem == 0 {
            return [String::new(), String::new(), String::new()];
        }
        let [tenant, weight, cap] = match self.rng.below(100) {
            0..=49 => ["", "", ""],
            50..=64 => ["t1", "1", ""],
            65..=79 => ["t2", "3", ""],
            80..=91 => ["t3", "1", "1"],
            92..=96 => ["t2", "2", "2"],
            97 => ["", "2", ""],
            _ => ["t1", "", ""],
        };
        [tenant.to_owned(), weight.to_owned(), cap.to_owned()]
    }

    fn lease_acquire_args(&mut self, client: usize, sem: usize, id: &str) -> (Vec<String>, u64) {
        let cap = self.picture(Primitive::Lease, sem).cap;
        let cap = if self.rng.chance(0.03) {
            self.pick(&[1, 2, 3, 5])
        } else {
            cap
        };
        let k = match self.rng.below(100) {
            0..=79 => 1,
            80..=94 => 2 + self.rng.below(2),
            95..=98 => cap + 1,
            _ => 5_000,
        };
        let label = if self.rng.chance(0.15) {
            self.pick(&["a", "b"])
        } else {
            ""
        };
        let exclusive = if !label.is_empty() && self.rng.chance(0.5) {
            "1"
        } else {
            "0"
        };
        let mode = if self.rng.chance(0.5) { "wait" } else { "try" };
        let lease = self.pick(&LEASES);
        let waiter_lease = self.pick(&WAITER_LEASES);
        let c = &mut self.clients[client];
        let seq = c.seq();
        let number = u64::from_str_radix(&seq, 16).unwrap_or_default();
        let args = vec![
            id.to_owned(),
            cap.to_string(),
            k.to_string(),
            lease.to_string(),
            label.to_owned(),
            exclusive.to_owned(),
            mode.to_owned(),
            waiter_lease.to_string(),
            c.channel(client),
            seq,
        ];
        (args, number)
    }

    fn lease(&mut self, client: usize, sem: usize) -> Step {
        let step =
            |op, args: Vec<String>, seqs| Step::new(Primitive::Lease, sem, op, args, client, seqs);
        match self.rng.below(100) {
            0..=34 => {
                let id = self.id();
                let (mut args, seq) = self.lease_acquire_args(client, sem, &id);
                let tenant = self.lease_tenant(sem);
                let c = &self.clients[client];
                args.push(c.session.clone());
                args.push(c.low());
                args.extend(tenant);
                step("lease_acquire", args, vec![seq])
            }
            35..=64 => {
                let holder = self.rng.chance(0.8);
                let id = self.some_id(Primitive::Lease, sem, holder);
                self.lease_release(client, sem, id, None)
            }
            65..=72 => {
                let id = self.some_id(Primitive::Lease, sem, false);
                let args = vec![
                    id,
                    self.pick(&LEASES).to_string(),
                    self.pick(&WAITER_LEASES).to_string(),
                ];
                step("lease_poll", args, vec![])
            }
            73..=77 => {
                let id = self.some_id(Primitive::Lease, sem, true);
                step(
                    "lease_refresh",
                    vec![id, self.pick(&LEASES).to_string()],
                    vec![],
                )
            }
            78..=80 => {
                let cap = self.pick(&[1, 2, 3, 5]);
                self.picture(Primitive::Lease, sem).cap = cap;
                step("lease_set_capacity", vec![cap.to_string()], vec![])
            }
            81..=84 => step("lease_status", vec![], vec![]),
            85..=89 => step("lease_tidy", vec![], vec![]),
            _ => {
                // A group commit: acquires and releases of one client.
                let mut args = vec![self.clients[client].channel(client)];
                args.push(self.clients[client].session.clone());
                let low_at = args.len();
                args.push(String::new());
                let mut seqs = Vec::new();
                for _ in 0..1 + self.rng.below(4) {
                    if self.rng.chance(0.5) {
                        let id = self.id();
                        let (mut acquire, seq) = self.lease_acquire_args(client, sem, &id);
                        // (The batch names one channel for all: ARGV[1].)
                        acquire.remove(8);
                        args.push("a".to_owned());
                        args.extend(acquire);
                        args.extend(self.lease_tenant(sem));
                        seqs.push(seq);
                    } else {
                        let holder = self.rng.chance(0.7);
                        let id = self.some_id(Primitive::Lease, sem, holder);
                        let seq = self.clients[client].seq();
                        seqs.push(u64::from_str_radix(&seq, 16).unwrap_or_default());
                        args.push(if holder { "r" } else { "w" }.to_owned());
                        args.push(id);
                        args.push(if holder { seq } else { "0".to_owned() });
                    }
                }
                args[low_at] = self.clients[client].low();
                step("lease_batch", args, seqs)
            }
        }
    }

    /// A release of `id` ("r", a new number), or its withdrawal ("w", naming the unanswered
    /// enqueue `enqueue` if any).
    fn lease_release(
        &mut self,
        client: usize,
        sem: usize,
        id: String,
        enqueue: Option<u64>,
    ) -> Step {
        let holder = enqueue.is_none()
            && (self
                .picture(Primitive::Lease, sem)
                .holders
                .iter()
                .any(|(h, _)| *h == id)
                || self.rng.chance(0.5));
        let c = &mut self.clients[client];
        let (seq, kind, seqs) = if holder {
            let seq = c.seq();
            let n = u64::from_str_radix(&seq, 16).unwrap_or_default();
            (seq, "r", vec![n])
        } else {
            (enqueue.map_or_else(|| "0".to_owned(), hex), "w", vec![])
        };
        let args = vec![
            id,
            c.channel(client),
            seq,
            c.session.clone(),
            c.low(),
            kind.to_owned(),
        ];
        Step::new(Primitive::Lease, sem, "lease_release", args, client, seqs)
    }

    fn permit_withdraw(
        &mut self,
        client: usize,
        sem: usize,
        id: String,
        unanswered: Option<u64>,
    ) -> Step {
        let c = &self.clients[client];
        let args = vec![
            id,
            unanswered.map_or_else(|| "0".to_owned(), hex),
            c.session.clone(),
            c.low(),
        ];
        Step::new(
            Primitive::Permit,
            sem,
            "permit_withdraw",
            args,
            client,
            vec![],
        )
    }

    fn permit(&mut self, client: usize, sem: usize) -> Step {
        let roll = self.rng.below(100);
        let waiter_lease = self.pick(&WAITER_LEASES).to_string();
        let k = if self.rng.chance(0.8) {
            1
        } else {
            2 + self.rng.below(2)
        };
        let delta: i64 = match self.rng.below(100) {
            0..=69 => 1,
            70..=89 => self.rng.below(4) as i64 - 1,
            90..=98 => -(self.rng.below(3) as i64) - 1,
            _ => 9_007_199_254_740_991,
        };
        let mode = if self.rng.chance(0.6) { "wait" } else { "try" };
        let (op, mut args, numbered): (&'static str, Vec<String>, bool) = match roll {
            0..=9 => {
                let permits = self.rng.below(4).to_string();
                ("permit_try_set", vec!["x".to_owned(), permits], true)
            }
            10..=44 => {
                let id = self.id();
                let channel = self.clients[client].channel(client);
                let args = vec![id, k.to_string(), mode.to_owned(), waiter_lease, channel];
                ("permit_acquire", args, true)
            }
            45..=69 => ("permit_add", vec!["x".to_owned(), delta.to_string()], true),
            70..=73 => ("permit_drain", vec!["x".to_owned()], true),
            74..=81 => {
                let id = self.some_id(Primitive::Permit, sem, false);
                ("permit_poll", vec![id, waiter_lease], true)
            }
            82..=85 => {
                let holder = self.rng.chance(0.3);
                let id = self.some_id(Primitive::Permit, sem, holder);
                return self.permit_withdraw(client, sem, id, None);
            }
            86..=89 => ("permit_available", vec![], false),
            90..=91 => ("permit_delete", vec![], false),
            _ => return self.permit_batch(client, sem),
        };
        let mut seqs = Vec::new();
        if numbered {
            let c = &mut self.clients[client];
            let seq = c.seq();
            seqs.push(u64::from_str_radix(&seq, 16).unwrap_or_default());
            args.push(seq);
            args.push(c.session.clone());
            args.push(c.low());
        }
        Step::new(Primitive::Permit, sem, op, args, client, seqs)
    }

    fn permit_batch(&mut self, client: usize, sem: usize) -> Step {
        let mut args = vec![
            self.clients[client].channel(client),
            self.clients[client].session.clone(),
            String::new(),
        ];
        let mut seqs = Vec::new();
        for _ in 0..1 + self.rng.below(4) {
            let roll = self.rng.below(4);
            let id = match roll {
                0 => self.id(),
                _ => self.some_id(Primitive::Permit, sem, roll == 1),
            };
            let waiter_lease = self.pick(&WAITER_LEASES).to_string();
            let k = (1 + self.rng.below(2)).to_string();
            let mode = if self.rng.chance(0.6) { "wait" } else { "try" };
            let seq = self.clients[client].seq();
            seqs.push(u64::from_str_radix(&seq, 16).unwrap_or_default());
            let op: Vec<String> = match roll {
                0 => vec!["a".into(), id, k, mode.into(), waiter_lease, seq],
                1 => vec!["m".into(), id, "1".into(), seq],
                2 => vec!["w".into(), id, "0".into()],
                _ => vec!["p".into(), id, waiter_lease, seq],
            };
            args.extend(op);
        }
        args[2] = self.clients[client].low();
        Step::new(Primitive::Permit, sem, "permit_batch", args, client, seqs)
    }

    fn latch(&mut self, client: usize, sem: usize) -> Step {
        let channel = format!("{SIDE}:latch{sem}");
        let roll = self.rng.below(100);
        let count = if self.rng.chance(0.97) {
            (1 + self.rng.below(4)).to_string()
        } else {
            "9007199254740991".to_owned()
        };
        let c = &mut self.clients[client];
        let (op, args, seqs) = match roll {
            0..=24 => {
                let seq = c.seq();
                let n = u64::from_str_radix(&seq, 16).unwrap_or_default();
                (
                    "latch_try_set",
                    vec![seq, c.session.clone(), c.low(), count],
                    vec![n],
                )
            }
            25..=74 => {
                let seq = c.seq();
                let n = u64::from_str_radix(&seq, 16).unwrap_or_default();
                (
                    "latch_count_down",
                    vec![seq, c.session.clone(), c.low(), channel],
                    vec![n],
                )
            }
            75..=92 => ("latch_state", vec![], vec![]),
            _ => ("latch_delete", vec![channel], vec![]),
        };
        Step::new(Primitive::Latch, sem, op, args, client, seqs)
    }

    /// Learn from the first engine's reply to `step` (and the grants it published).
    pub fn observe(&mut self, step: &Step, reply: &Value, published: &[String]) {
        let c = &mut self.clients[step.client];
        if step.lost {
            c.lost.push(step.clone());
            return;
        }
        for seq in &step.seqs {
            c.open.remove(seq);
        }
        // Grants woken by message or handed back: "id|token|slots|delay".
        let mut granted: Vec<String> = published
            .iter()
            .filter_map(|m| m.split_once(' ').map(|(_, msg)| msg))
            .filter_map(|msg| msg.split('|').next().map(str::to_owned))
            .collect();
        let items = match reply {
            Value::Array(items) => items.as_slice(),
            _ => &[],
        };
        let head = items.first().and_then(text);
        if step.op == "lease_release" {
            granted.extend(
                items
                    .iter()
                    .skip(2)
                    .filter_map(text)
                    .filter_map(|m| m.split('|').next().map(str::to_owned)),
            );
        }
        let picture = self.picture(step.primitive, step.sem);
        let id = step.args.first().cloned().unwrap_or_default();
        for g in granted {
            picture.waiters.retain(|(w, _)| *w != g);
            picture.woken.push(g.clone());
            picture.holders.push((g, 1));
        }
        match (step.op, head.as_deref()) {
            (
                "lease_acquire" | "permit_acquire" | "lease_poll" | "permit_poll",
                Some("GRANTED"),
            ) => {
                picture.waiters.retain(|(w, _)| *w != id);
                picture.holders.push((id.clone(), 1));
            }
            ("lease_acquire" | "permit_acquire", Some("QUEUED")) => {
                let seq = step.seqs.first().copied().unwrap_or_default();
                picture.waiters.push((id.clone(), seq));
            }
            ("lease_release" | "permit_withdraw", _) | (_, Some("GONE")) => {
                picture.holders.retain(|(h, _)| *h != id);
                picture.waiters.retain(|(w, _)| *w != id);
                picture.old.push(id.clone());
            }
            _ => {}
        }
        if step.op.ends_with("_poll")
            || step.op.ends_with("_release")
            || step.op.ends_with("_withdraw")
        {
            picture.woken.retain(|w| *w != id);
        }
        if picture.woken.len() > 16 {
            picture.woken.remove(0);
        }
        if picture.old.len() > 64 {
            picture.old.remove(0);
        }
        if picture.holders.len() > 64 {
            picture.holders.remove(0);
        }
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Whether key `index` of `primitive` holds a string (its foreign value is then a list).
pub fn is_string_key(primitive: Primitive, index: usize) -> bool {
    primitive.string_key(index)
}
