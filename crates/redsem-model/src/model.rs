//! The model: its state, its actions (clients, server, clock, faults) and its properties.

use stateright::{Model, Property};

use crate::client::{Client, Ctx, Main, Msg, Reply, Req, Sights};
use crate::server::{Effects, Run, Server};
use crate::{Config, Half, ReqId};

/// Everything the model tracks, ghosts included.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The server's tick.
    pub now: u8,
    pub server: Server,
    pub clients: Vec<Client>,
    /// Faults injected so far.
    pub faults: u8,
    /// Every client finished, and a status call later than every lease end ran.
    pub audited: bool,
    /// The last token granted, across state losses (a ghost).
    pub last_token: Option<u32>,
    /// Every grant's token was larger than the one before.
    pub tokens_in_order: bool,
    /// Waiters whose client did not stall (nor lose the state) since they were queued, with
    /// their arrival number, in queue order (a ghost).
    pub fifo: Vec<(ReqId, u8)>,
    /// No grant went to a request that arrived after one of those.
    pub fifo_kept: bool,
    pub(crate) seen: Sights,
    /// A resent request was answered as the first time.
    pub resent_answered: bool,
    /// The server restarted while someone held or waited.
    pub restarted_busy: bool,
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock moves on one tick (only once every client not stalled has done what was due).
    Tick,
    /// Client `c`'s task takes its next step.
    Step(u8),
    /// Client `c`'s keepalive renews, or finds the validity ended.
    Renew(u8),
    /// Client `c` sends its due background withdrawals.
    Withdraw(u8),
    /// The server runs client `c`'s first request.
    Exec(u8),
    /// Client `c` reads its first reply.
    Receive(u8),
    /// Client `c`'s notifier reads the wake-up on its pub/sub connection and routes it to the
    /// mailbox of the request id it names, if that one is registered.
    Deliver(u8),
    /// Fault: client `c`'s first reply is lost.
    LoseReply(u8),
    /// Fault: the wake-up on its way to client `c` is lost.
    LoseWake(u8),
    /// Fault: client `c` stalls.
    Stall(u8),
    /// Fault: the server restarts from its AOF.
    Restart,
    /// Fault: the server loses its state.
    LoseState,
    /// Every client finished: a status call past every lease end.
    Audit,
}

/// The lease semaphore's waiting protocol, as a stateright model.
#[derive(Clone, Debug)]
pub struct LeaseModel {
    pub cfg: Config,
    /// Judge only the `always` properties whose name starts with this (all if `None`).
    pub watch: Option<&'static str>,
}

impl LeaseModel {
    pub fn new(cfg: Config) -> LeaseModel {
        LeaseModel { cfg, watch: None }
    }

    /// A model that judges only the `always` properties named `prefix...` (another one a bug
    /// breaks first would otherwise end every path before this one can break).
    pub fn watching(cfg: Config, prefix: &'static str) -> LeaseModel {
        LeaseModel {
            cfg,
            watch: Some(prefix),
        }
    }

    /// A state that breaks a judged `always` property: the checker goes no further from it, so
    /// the counterexample it reports ends at the first state that broke the property.
    fn broken(&self, state: &State) -> bool {
        self.properties().iter().any(|p| {
            p.expectation == stateright::Expectation::Always && !(p.condition)(self, state)
        })
    }

    fn ctx(&self, c: usize, now: u8) -> Ctx<'_> {
        Ctx {
            cfg: &self.cfg,
            c,
            now,
        }
    }

    fn fault_left(&self, state: &State) -> bool {
        state.faults < self.cfg.faults.budget
    }

    /// Apply what a script did: wake-ups to the waiters' mailboxes, the ghosts of grants and
    /// queued requests.
    fn apply(&self, state: &mut State, fx: Effects) {
        // (A withdrawal comes first: the grants it lets through are made after it.)
        for id in fx.withdrawn {
            state.fifo.retain(|&(w, _)| w != id);
        }
        for (id, token, arrival) in fx.grants {
            if state.last_token.is_some_and(|last| token <= last) {
                state.tokens_in_order = false;
            }
            state.last_token = Some(token);
            if state.fifo.iter().any(|&(w, a)| w != id && a < arrival) {
                state.fifo_kept = false;
            }
            state.fifo.retain(|&(w, _)| w != id);
        }
        for (id, client, arrival) in fx.queued {
            if !state.clients[usize::from(client)].stalled() {
                state.fifo.push((id, arrival));
            }
        }
        for (client, wake) in fx.wakes {
            state.clients[usize::from(client)].pubsub = Some(wake);
        }
        state.resent_answered |= fx.resent;
        if let Some((client, seq)) = fx.released
            && let Main::Releasing {
                seq: mine, applied, ..
            } = &mut state.clients[usize::from(client)].main
            && *mine == seq
        {
            *applied = true;
        }
    }

    /// Client `c` stalled (or the state was lost): its waiters are no longer judged by the FIFO
    /// rule, since a waiter that misses its check-ins loses its place by design.
    fn taint(state: &mut State, c: usize) {
        state.fifo.retain(|&(w, _)| usize::from(w >> 5) != c);
    }

    /// The connection of every client drops: whatever is on the wire fails; the pub/sub
    /// connection too, and the notifier wakes every waiter once when it is back. `lost`: the
    /// state went with it, and every waiter's place (no longer judged by the FIFO rule).
    fn drop_connections(state: &mut State, lost: bool) {
        let now_h = 2 * Half::from(state.now) + 1;
        for c in 0..state.clients.len() {
            if lost {
                Self::taint(state, c);
            }
            let client = &mut state.clients[c];
            for msg in &mut client.net {
                *msg = match *msg {
                    Msg::Req(req) | Msg::Rep(req, _) => Msg::Rep(req, Reply::Failed),
                };
            }
            client.pubsub = None;
            match &mut client.main {
                Main::Napping { recheck, .. } => *recheck = (*recheck).min(now_h),
                // (A release's outcome is judged within a state epoch.)
                Main::Releasing { applied, .. } if lost => *applied = false,
                _ => {}
            }
        }
    }

    /// Every client has nothing due, or is stalled: the clock may move.
    fn quiet(&self, state: &State) -> bool {
        state.clients.iter().enumerate().all(|(c, client)| {
            let ctx = self.ctx(c, state.now);
            client.stalled()
                || (client.net.is_empty()
                    && client.pubsub.is_none()
                    && !client.main_due(&ctx)
                    && !client.keepalive_due(&ctx)
                    && !client.withdrawal_due(&ctx))
        })
    }
}

/// The request id a client's notifier mailbox is registered for.
fn registered(main: &Main) -> Option<ReqId> {
    match *main {
        Main::Asking { id, wait: true, .. }
        | Main::Napping { id, .. }
        | Main::Polling { id, .. }
        | Main::Resend { id, .. } => Some(id),
        _ => None,
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            server: Server::default(),
            clients: (0..self.cfg.clients()).map(|_| Client::new()).collect(),
            faults: 0,
            audited: false,
            last_token: None,
            tokens_in_order: true,
            fifo: Vec::new(),
            fifo_kept: true,
            seen: Sights::default(),
            resent_answered: false,
            restarted_busy: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.audited || self.broken(state) {
            return;
        }
        let faults = self.cfg.faults;
        let fault_left = self.fault_left(state);
        for (c, client) in state.clients.iter().enumerate() {
            let ctx = self.ctx(c, state.now);
            let id = c as u8;
            if client.net.iter().any(|m| matches!(m, Msg::Req(_))) {
                actions.push(Action::Exec(id));
            }
            if client.stalled() {
                continue;
            }
            if client.main_due(&ctx) {
                actions.push(Action::Step(id));
            }
            if client.keepalive_due(&ctx) {
                actions.push(Action::Renew(id));
            }
            if client.withdrawal_due(&ctx) {
                actions.push(Action::Withdraw(id));
            }
            if matches!(client.net.first(), Some(Msg::Rep(..))) {
                actions.push(Action::Receive(id));
            }
            if client.pubsub.is_some() {
                actions.push(Action::Deliver(id));
            }
            if fault_left {
                let live_reply = client
                    .net
                    .iter()
                    .any(|m| matches!(m, Msg::Rep(_, r) if *r != Reply::Failed));
                if faults.lose_reply && live_reply {
                    actions.push(Action::LoseReply(id));
                }
                if faults.lose_wake && client.pubsub.is_some() {
                    actions.push(Action::LoseWake(id));
                }
                if faults.stall > 0 && client.main != Main::Done {
                    actions.push(Action::Stall(id));
                }
            }
        }
        if fault_left && faults.restart {
            actions.push(Action::Restart);
        }
        if fault_left && faults.state_loss {
            actions.push(Action::LoseState);
        }
        if state.clients.iter().all(Client::finished) {
            actions.push(Action::Audit);
        } else if state.now < self.cfg.horizon && self.quiet(state) {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let now = state.now;
        match action {
            Action::Tick => {
                state.now += 1;
                state.server.grants_in_tick = 0;
                for client in &mut state.clients {
                    if client.stalled_until.is_some_and(|until| until <= state.now) {
                        client.stalled_until = None;
                    }
                }
            }
            Action::Step(c) | Action::Renew(c) | Action::Withdraw(c) | Action::Receive(c) => {
                let c = usize::from(c);
                let ctx = self.ctx(c, now);
                let (client, seen) = (&mut state.clients[c], &mut state.seen);
                match action {
                    Action::Step(_) => client.step(&ctx, seen),
                    Action::Renew(_) => client.keepalive(&ctx, seen),
                    Action::Receive(_) => client.receive(&ctx, seen),
                    _ => client.withdraw(&ctx),
                }
            }
            Action::Exec(c) => {
                let i = state.clients[usize::from(c)]
                    .net
                    .iter()
                    .position(|m| matches!(m, Msg::Req(_)))?;
                let Msg::Req(req) = state.clients[usize::from(c)].net[i] else {
                    return None;
                };
                let mut run = Run {
                    cfg: &self.cfg,
                    now,
                    fx: Effects::default(),
                };
                let server = &mut state.server;
                let reply = match req {
                    Req::Acquire {
                        id,
                        units,
                        wait,
                        seq,
                        ..
                    } => server.acquire(&mut run, id, units, wait, (c, seq)),
                    Req::Poll { id } => server.poll(&mut run, id),
                    Req::Refresh { id, .. } => server.refresh(&mut run, id),
                    Req::Release { id, seq, low } => server.release(&mut run, id, (c, seq, low)),
                    Req::Withdraw { id, pending, low } => {
                        server.withdraw(&mut run, id, (c, pending, low))
                    }
                };
                state.clients[usize::from(c)].net[i] = Msg::Rep(req, reply);
                self.apply(&mut state, run.fx);
            }
            Action::LoseReply(c) => {
                let c = usize::from(c);
                let net = &mut state.clients[c].net;
                let i = net
                    .iter()
                    .position(|m| matches!(m, Msg::Rep(_, r) if *r != Reply::Failed))?;
                if let Msg::Rep(req, _) = net[i] {
                    net[i] = Msg::Rep(req, Reply::Failed);
                }
                // (Not a fault the FIFO rule forgives: the check-in is resent within the
                // waiter lease, with the same id.)
                state.faults += 1;
            }
            Action::Deliver(c) => {
                let client = &mut state.clients[usize::from(c)];
                if let Some(wake) = client.pubsub.take()
                    && registered(&client.main) == Some(wake.id)
                {
                    client.mailbox = Some(wake);
                }
            }
            Action::LoseWake(c) => {
                state.clients[usize::from(c)].pubsub = None;
                state.faults += 1;
            }
            Action::Stall(c) => {
                let c = usize::from(c);
                let client = &mut state.clients[c];
                client.stalled_until = Some(now + self.cfg.faults.stall);
                if matches!(client.main, Main::Holding(_)) {
                    client.stalled_holding = true;
                }
                state.faults += 1;
                Self::taint(&mut state, c);
            }
            Action::Restart => {
                state.restarted_busy |= !state.server.idle();
                Self::drop_connections(&mut state, false);
                state.faults += 1;
            }
            Action::LoseState => {
                Self::drop_connections(&mut state, true);
                state.server.lose_state();
                state.faults += 1;
            }
            Action::Audit => {
                let mut run = Run {
                    cfg: &self.cfg,
                    now: now + self.cfg.lease.max(self.cfg.waiter_lease),
                    fx: Effects::default(),
                };
                state.server.status(&mut run);
                self.apply(&mut state, run.fx);
                state.audited = true;
            }
        }
        Some(state)
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.now <= self.cfg.horizon
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let always: [(&'static str, Condition); 7] = [
            ("capacity: units believed held <= capacity", capacity_kept),
            (
                "slots: believed slots distinct and below capacity",
                slots_kept,
            ),
            (
                "validity: no belief outlasts the server's lease",
                within_lease,
            ),
            ("tokens: strictly increasing in grant order", |_, s| {
                s.tokens_in_order
            }),
            ("fifo: among waiters that never stalled", |_, s| s.fifo_kept),
            (
                "release: a release the server applied is not answered NOTHELD",
                |_, s| !s.seen.release_denied,
            ),
            ("return: idle once every client stopped", |_, s| {
                !s.audited || s.server.idle()
            }),
        ];
        let sometimes: [(&'static str, Condition); 7] = [
            (
                "sometimes: a grant handed to a waiter by wake-up",
                |_, s| s.seen.handed,
            ),
            ("sometimes: a grant collected by a poll", |_, s| {
                s.seen.polled
            }),
            (
                "sometimes: a resent request answered as the first",
                |_, s| s.resent_answered,
            ),
            ("sometimes: a stall that loses a lease", |_, s| {
                s.seen.lost_after_stall
            }),
            ("sometimes: a waiter queued again after GONE", |_, s| {
                s.seen.requeued
            }),
            (
                "sometimes: a restart while someone holds or waits",
                |_, s| s.restarted_busy,
            ),
            ("sometimes: every client finished", |_, s| s.audited),
        ];
        let judged = |name: &str| self.watch.is_none_or(|prefix| name.starts_with(prefix));
        always
            .into_iter()
            .filter(|(name, _)| judged(name))
            .map(|(name, condition)| Property::always(name, condition))
            .chain(
                sometimes
                    .into_iter()
                    .map(|(name, condition)| Property::sometimes(name, condition)),
            )
            .collect()
    }
}

/// A property's condition.
type Condition = fn(&LeaseModel, &State) -> bool;

/// Per state epoch, the units believed held (at the start of the tick) fit the capacity.
fn capacity_kept(model: &LeaseModel, state: &State) -> bool {
    (0..=state.server.epoch).all(|epoch| {
        let held: u32 = state
            .clients
            .iter()
            .filter_map(|c| c.believes(state.now))
            .filter(|h| h.epoch == epoch)
            .map(|h| u32::from(h.units))
            .sum();
        held <= u32::from(model.cfg.capacity)
    })
}

/// Per state epoch, the believed permits have disjoint slots, each below the capacity.
fn slots_kept(model: &LeaseModel, state: &State) -> bool {
    let below = if model.cfg.capacity >= 8 {
        u8::MAX
    } else {
        (1u8 << model.cfg.capacity) - 1
    };
    (0..=state.server.epoch).all(|epoch| {
        let mut taken = 0u8;
        for h in state
            .clients
            .iter()
            .filter_map(|c| c.believes(state.now))
            .filter(|h| h.epoch == epoch)
        {
            if h.slots & !below != 0 || h.slots & taken != 0 {
                return false;
            }
            taken |= h.slots;
        }
        true
    })
}

/// Every permit believed held (of the current state) is held by the server with the same token
/// for at least as long as the holder believes it.
fn within_lease(_: &LeaseModel, state: &State) -> bool {
    state
        .clients
        .iter()
        .filter_map(|c| c.believes(state.now))
        .filter(|h| h.epoch == state.server.epoch)
        .all(|h| match state.server.records.get(&h.id) {
            Some(crate::server::Record::Holder { token, ends, .. }) => {
                *token == h.token && h.valid <= 2 * Half::from(*ends)
            }
            _ => false,
        })
}
