//! A client: one task running its operations through the waiting engine
//! (`crates/redsem/src/wait/`), the keepalive of the permit it holds (`keepalive.rs`,
//! `lease/permit.rs`), and its background withdrawals (`wait/withdraw.rs`).
//!
//! Its clock is in half ticks ([`Half`]): it acts at `2 * now + 1`, after the server's
//! millisecond began. What it believes follows `lease/mod.rs`: a grant's local validity is
//! `sent + delay + lease − 1 ms`, for a grant taken from a wake-up at most `sent + waiter lease
//! − 1 ms` (`sent`: the first attempt of the last check-in), and a renewal sent at `sent`
//! moves it to `sent + lease − 1 ms`.
//!
//! The client is one session (`session.rs`): an enqueue and a holder's release each take the
//! next sequence number and keep it open until answered (a resend keeps the number); a
//! withdrawal names the enqueue if that went unanswered, kept open until the withdrawal is
//! answered. Every call carries the low mark, the lowest number still open. A check-in
//! (`lease_poll`) takes no number here: the library numbers it too, but `lease_poll` reads no
//! session and no copy of a call arrives late in this model, so its number would only hold
//! the low mark (and the states would be a quarter more).

use crate::{Bug, Config, Half, Op, ReqId};

/// A request on its way to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Req {
    /// `lease_acquire` (`wait`: mode "wait"), numbered `seq`, with the low mark `low`.
    Acquire {
        id: ReqId,
        units: u8,
        wait: bool,
        seq: u8,
        low: u8,
    },
    /// `lease_poll`.
    Poll { id: ReqId },
    /// `lease_refresh`, sent at `sent` (the keepalive moves the validity from it).
    Refresh { id: ReqId, sent: Half },
    /// `lease_release` "r": the holder's release, numbered `seq`, with the low mark `low`.
    Release { id: ReqId, seq: u8, low: u8 },
    /// `lease_release` "w": a withdrawal naming the call `pending` that went unanswered (0:
    /// none), with the low mark `low`.
    Withdraw { id: ReqId, pending: u8, low: u8 },
}

/// A script's answer, or the failure the client sees instead (the reply lost, the connection
/// dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    Granted {
        token: u32,
        slots: u8,
        epoch: u8,
    },
    /// Queued; check in again within `recheck` ticks.
    Queued {
        recheck: u8,
    },
    Busy,
    Gone,
    Ok,
    NotHeld,
    Released,
    Dequeued,
    /// The call failed: `Error::Unavailable`.
    Failed,
}

/// On one client's connection, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Msg {
    /// Sent, not yet run by the server.
    Req(Req),
    /// Run (or failed), its answer on the way back.
    Rep(Req, Reply),
}

/// A wake-up: `id|token|slots|delay` on the waiter's channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Wake {
    pub id: ReqId,
    pub token: u32,
    pub slots: u8,
    /// Ticks since the waiter's last check-in, as the server counts them.
    pub delay: u8,
    pub epoch: u8,
}

/// A permit the client holds, with its keepalive entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holding {
    pub id: ReqId,
    pub token: u32,
    pub units: u8,
    pub slots: u8,
    /// The server's state epoch of the grant (a ghost).
    pub epoch: u8,
    /// The local validity: believed held while the clock is before it.
    pub valid: Half,
    /// The tick at which the task releases it.
    pub release_at: u8,
    /// When the next renewal is due.
    pub renew_at: Half,
    /// A renewal in flight, sent at this instant.
    pub renewing: Option<Half>,
    /// Known lost (a renewal answered NOTHELD, or the validity ran out).
    pub lost: bool,
    /// Taken from a wake-up (unclaimed on the server until the first renewal).
    pub handed: bool,
}

/// Where the client's task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Main {
    /// Between operations.
    Idle,
    /// `lease_acquire` sent at `sent`; `last`: when the check-in loop began (its retries stay
    /// within a waiter lease of it), which is also its first attempt; `resent`: a try's one
    /// resend was used; `seq`: the enqueue's number.
    Asking {
        id: ReqId,
        seq: u8,
        wait: bool,
        last: Half,
        sent: Half,
        resent: bool,
    },
    /// Queued: naps until a wake-up or `recheck`; `first` and `sent`: when the first and the
    /// answered attempt of the last check-in were sent (`check_in::Sent`).
    Napping {
        id: ReqId,
        first: Half,
        sent: Half,
        recheck: Half,
    },
    /// `lease_poll` sent at `sent`, first at `first`; `last`: the last answered check-in.
    Polling {
        id: ReqId,
        last: Half,
        first: Half,
        sent: Half,
    },
    /// A check-in failed; sent again at `at` (`retry::RETRY_EVERY` later); `first`: its first
    /// attempt; `seq`: its number (0 for a check-in: not numbered).
    Resend {
        id: ReqId,
        seq: u8,
        poll: bool,
        last: Half,
        first: Half,
        at: Half,
    },
    Holding(Holding),
    /// The holder's `lease_release` numbered `seq` sent (`resent`: its one resend used);
    /// `applied`: the server released the permit by it (a ghost, for the `release` property).
    Releasing {
        id: ReqId,
        seq: u8,
        resent: bool,
        applied: bool,
    },
    /// Every operation ran.
    Done,
}

/// A background withdrawal (`Withdraw` dropped armed): `lease_release` "w" of `id`, naming
/// its call `pending` that went unanswered (0: none; kept open until the withdrawal is
/// answered), sent again every `RETRY_EVERY` while it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Withdrawal {
    pub id: ReqId,
    pub pending: u8,
    pub at: Half,
    pub sending: bool,
}

/// One client process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// The next operation.
    pub pc: u8,
    /// Request ids used so far.
    pub ids: u8,
    /// The session's next sequence number (the first is 1).
    pub next: u8,
    pub main: Main,
    pub withdrawals: Vec<Withdrawal>,
    pub net: Vec<Msg>,
    /// The last wake-up published to this client's channel, still on its pub/sub connection.
    pub pubsub: Option<Wake>,
    /// The wake-up the notifier routed to the current request's mailbox, not yet read.
    pub mailbox: Option<Wake>,
    /// The current request's enqueue took more than one attempt (`Sent::resent`): it takes no
    /// grant from a wake-up.
    pub enqueue_resent: bool,
    /// Frozen (process and connection) until this tick.
    pub stalled_until: Option<u8>,
    /// Stalled at some point while holding its current permit (a ghost).
    pub stalled_holding: bool,
}

/// Things the client saw that the `sometimes` properties ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Sights {
    pub(crate) handed: bool,
    pub(crate) polled: bool,
    pub(crate) requeued: bool,
    pub(crate) lost_after_stall: bool,
    /// A holder's release that the server applied was answered `NOTHELD` (in the same state
    /// epoch).
    pub(crate) release_denied: bool,
}

/// The client `c` of `cfg` at time `now`.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) c: usize,
    pub(crate) now: u8,
}

impl Ctx<'_> {
    fn now_h(&self) -> Half {
        2 * Half::from(self.now) + 1
    }

    fn op(&self, client: &Client) -> Option<Op> {
        self.cfg.ops[self.c].get(usize::from(client.pc)).copied()
    }
}

impl Client {
    pub(crate) fn new() -> Client {
        Client {
            pc: 0,
            ids: 0,
            next: 1,
            main: Main::Idle,
            withdrawals: Vec::new(),
            net: Vec::new(),
            pubsub: None,
            mailbox: None,
            enqueue_resent: false,
            stalled_until: None,
            stalled_holding: false,
        }
    }

    /// Take the session's next sequence number.
    fn open(&mut self) -> u8 {
        let n = self.next;
        self.next += 1;
        n
    }

    /// The low mark: the lowest number still open (the task's call in flight or between its
    /// attempts, a withdrawal's unanswered call), or the next one if none is.
    pub fn low(&self) -> u8 {
        let main = match self.main {
            Main::Asking { seq, .. } | Main::Resend { seq, .. } | Main::Releasing { seq, .. }
                if seq != 0 =>
            {
                seq
            }
            _ => self.next,
        };
        self.withdrawals
            .iter()
            .filter(|w| w.pending != 0)
            .map(|w| w.pending)
            .fold(main, u8::min)
    }

    pub fn stalled(&self) -> bool {
        self.stalled_until.is_some()
    }

    /// The permit this client believes it holds at the start of tick `now` (a part of the tick
    /// is enough: another client may be granted in that very tick).
    pub fn believes(&self, now: u8) -> Option<&Holding> {
        match &self.main {
            Main::Holding(h) if !h.lost && 2 * Half::from(now) < h.valid => Some(h),
            _ => None,
        }
    }

    /// The task has something to do now.
    pub(crate) fn main_due(&self, ctx: &Ctx<'_>) -> bool {
        let now_h = ctx.now_h();
        match &self.main {
            Main::Idle => true,
            Main::Napping { recheck, .. } => self.mailbox.is_some() || now_h >= *recheck,
            Main::Resend { at, .. } => now_h >= *at,
            Main::Holding(h) => ctx.now >= h.release_at,
            Main::Asking { .. } | Main::Polling { .. } | Main::Releasing { .. } | Main::Done => {
                false
            }
        }
    }

    /// The keepalive has something to do now: a renewal, or the loss of an expired validity.
    pub(crate) fn keepalive_due(&self, ctx: &Ctx<'_>) -> bool {
        let now_h = ctx.now_h();
        match &self.main {
            Main::Holding(h) if !h.lost => {
                now_h >= h.valid || (h.renewing.is_none() && now_h >= h.renew_at)
            }
            _ => false,
        }
    }

    pub(crate) fn withdrawal_due(&self, ctx: &Ctx<'_>) -> bool {
        self.withdrawals
            .iter()
            .any(|w| !w.sending && ctx.now_h() >= w.at)
    }

    /// Nothing left to do, ever.
    pub fn finished(&self) -> bool {
        self.main == Main::Done && self.net.is_empty() && self.withdrawals.is_empty()
    }

    /// The task's next step (only when [`Client::main_due`]).
    pub(crate) fn step(&mut self, ctx: &Ctx<'_>, seen: &mut Sights) {
        let now_h = ctx.now_h();
        match self.main {
            Main::Idle => match ctx.op(self) {
                Some(op) => self.ask(ctx, op),
                None => self.main = Main::Done,
            },
            Main::Napping {
                id, first, sent, ..
            } => {
                // The news is taken from the mailbox whether it is used or not.
                let wake = self.mailbox.take().filter(|w| w.id == id);
                // `wait::acquire`: a request whose enqueue was resent takes no grant from a
                // wake-up (a poll claims it); else `LeaseRequest::handed` takes it with more
                // than half the waiter lease left, counted (as is the validity) from the first
                // attempt of the last check-in.
                let takes = !(self.enqueue_resent && ctx.cfg.no_wake_after_resend());
                let from = if ctx.cfg.judges_wake_by_first() {
                    first
                } else {
                    sent
                };
                match wake {
                    Some(w) if takes && from + ctx.cfg.waiter_lease_h() / 2 > now_h => {
                        let delay = 2 * Half::from(w.delay);
                        let valid = (from + delay + ctx.cfg.lease_h())
                            .min(from + ctx.cfg.waiter_lease_h())
                            .saturating_sub(ctx.cfg.clock_step_h());
                        let granted = Holding {
                            id,
                            token: w.token,
                            units: 0,
                            slots: w.slots,
                            epoch: w.epoch,
                            valid,
                            release_at: 0,
                            renew_at: 0,
                            renewing: None,
                            lost: false,
                            handed: true,
                        };
                        seen.handed = true;
                        self.hold(ctx, granted);
                    }
                    // The window of the poll counts from the answered attempt.
                    _ => self.send_poll(ctx, id, sent),
                }
            }
            Main::Resend {
                id,
                seq,
                poll,
                last,
                first,
                ..
            } => {
                if poll {
                    self.net.push(Msg::Req(Req::Poll { id }));
                    self.main = Main::Polling {
                        id,
                        last,
                        first,
                        sent: now_h,
                    };
                } else {
                    self.enqueue_resent = true;
                    if ctx.cfg.bug == Bug::NewsClearedOnResend {
                        self.mailbox = None;
                    }
                    self.send_acquire(ctx, (id, seq), true, last, now_h, false);
                }
            }
            Main::Holding(h) => {
                // `LeasePermit::release`: the keepalive is cancelled first; one call of the
                // session.
                let seq = self.open();
                self.main = Main::Releasing {
                    id: h.id,
                    seq,
                    resent: false,
                    applied: false,
                };
                let low = self.low();
                self.net.push(Msg::Req(Req::Release { id: h.id, seq, low }));
            }
            Main::Asking { .. } | Main::Polling { .. } | Main::Releasing { .. } | Main::Done => {}
        }
    }

    /// The keepalive's next step (only when [`Client::keepalive_due`]).
    pub(crate) fn keepalive(&mut self, ctx: &Ctx<'_>, seen: &mut Sights) {
        let now_h = ctx.now_h();
        let stalled_holding = self.stalled_holding;
        if let Main::Holding(h) = &mut self.main {
            if now_h >= h.valid {
                h.lost = true;
                if stalled_holding {
                    seen.lost_after_stall = true;
                }
            } else {
                h.renewing = Some(now_h);
                let req = Req::Refresh {
                    id: h.id,
                    sent: now_h,
                };
                self.net.push(Msg::Req(req));
            }
        }
    }

    /// Send the due background withdrawals.
    pub(crate) fn withdraw(&mut self, ctx: &Ctx<'_>) {
        let now_h = ctx.now_h();
        let low = self.low();
        for w in &mut self.withdrawals {
            if !w.sending && now_h >= w.at {
                w.sending = true;
                self.net.push(Msg::Req(Req::Withdraw {
                    id: w.id,
                    pending: w.pending,
                    low,
                }));
            }
        }
    }

    /// Take the first reply off the connection.
    pub(crate) fn receive(&mut self, ctx: &Ctx<'_>, seen: &mut Sights) {
        let Some(&Msg::Rep(req, reply)) = self.net.first() else {
            return;
        };
        self.net.remove(0);
        match req {
            Req::Acquire { id, .. } => self.answered(ctx, id, false, reply, seen),
            Req::Poll { id } => self.answered(ctx, id, true, reply, seen),
            Req::Refresh { id, sent } => self.renewed(ctx, id, sent, reply),
            Req::Withdraw { id, .. } => {
                if let Some(i) = self.withdrawals.iter().position(|w| w.id == id) {
                    if reply == Reply::Failed {
                        self.withdrawals[i].sending = false;
                        self.withdrawals[i].at = ctx.now_h() + ctx.cfg.retry_h();
                    } else {
                        self.withdrawals.remove(i);
                    }
                }
            }
            Req::Release { id, .. } => {
                if let Main::Releasing {
                    id: mine,
                    seq,
                    resent,
                    applied,
                } = self.main
                    && mine == id
                {
                    if reply == Reply::Failed && !resent {
                        // `retry_once`: sent once more with the same number.
                        let seq = if ctx.cfg.bug == Bug::ReleaseRenumbered {
                            self.open()
                        } else {
                            seq
                        };
                        self.main = Main::Releasing {
                            id,
                            seq,
                            resent: true,
                            applied,
                        };
                        let low = self.low();
                        self.net.push(Msg::Req(Req::Release { id, seq, low }));
                    } else {
                        seen.release_denied |= applied && reply == Reply::NotHeld;
                        self.next_op();
                    }
                }
            }
        }
    }

    /// The answer to a check-in of `id` (an enqueue, or a poll).
    fn answered(&mut self, ctx: &Ctx<'_>, id: ReqId, poll: bool, reply: Reply, seen: &mut Sights) {
        let now_h = ctx.now_h();
        let (seq, wait, last, first, sent, resent) = match self.main {
            Main::Asking {
                id: mine,
                seq,
                wait,
                last,
                sent,
                resent,
            } if mine == id && !poll => (seq, wait, last, last, sent, resent),
            Main::Polling {
                id: mine,
                last,
                first,
                sent,
            } if mine == id && poll => (0, true, last, first, sent, false),
            _ => return,
        };
        match reply {
            Reply::Granted {
                token,
                slots,
                epoch,
            } => {
                let valid = (sent + ctx.cfg.lease_h()).saturating_sub(ctx.cfg.clock_step_h());
                if poll {
                    seen.polled = true;
                }
                let granted = Holding {
                    id,
                    token,
                    units: 0,
                    slots,
                    epoch,
                    valid,
                    release_at: 0,
                    renew_at: 0,
                    renewing: None,
                    lost: false,
                    handed: false,
                };
                self.hold(ctx, granted);
            }
            Reply::Queued { recheck } => {
                self.main = Main::Napping {
                    id,
                    first,
                    sent,
                    recheck: now_h + 2 * Half::from(recheck),
                };
            }
            Reply::Gone if wait => {
                // The place was dropped: queue again under a new id; the old one is withdrawn
                // in the background (its guard dropped armed), so a late resend of it is refused.
                seen.requeued = true;
                self.withdrawals.push(Withdrawal {
                    id,
                    pending: 0,
                    at: now_h,
                    sending: false,
                });
                match ctx.op(self) {
                    Some(op) => self.ask(ctx, op),
                    None => self.next_op(),
                }
            }
            Reply::Failed if wait => {
                // `check_in`: again after RETRY_EVERY while the waiter lease of the last
                // answered check-in keeps the place; else the acquire fails and the guard
                // withdraws the request in the background.
                if now_h + ctx.cfg.retry_h() < last + ctx.cfg.waiter_lease_h() {
                    self.main = Main::Resend {
                        id,
                        seq,
                        poll,
                        last,
                        first,
                        at: now_h + ctx.cfg.retry_h(),
                    };
                } else {
                    self.give_up(ctx, id, seq);
                }
            }
            Reply::Failed if !resent => {
                // A try: `retry_once`, at once, with the same id and number; its lease is
                // counted from the first attempt.
                self.send_acquire(ctx, (id, seq), false, last, sent, true);
            }
            Reply::Failed => self.give_up(ctx, id, seq),
            // Busy (a try refused), a try answered GONE (a protocol error), or an answer that
            // fits no check-in: the operation ends.
            _ => self.next_op(),
        }
    }

    /// A renewal sent at `sent` answered.
    fn renewed(&mut self, ctx: &Ctx<'_>, id: ReqId, sent: Half, reply: Reply) {
        let now_h = ctx.now_h();
        let Main::Holding(h) = &mut self.main else {
            return;
        };
        if h.id != id || h.renewing != Some(sent) {
            return;
        }
        h.renewing = None;
        let period = ctx.cfg.period_h();
        match reply {
            Reply::Ok => {
                let until = (sent + ctx.cfg.lease_h()).saturating_sub(ctx.cfg.clock_step_h());
                h.valid = h.valid.max(until);
                h.handed = false;
                h.renew_at = h.renew_at.max(now_h) + period;
            }
            Reply::Failed => h.renew_at = now_h + ctx.cfg.retry_h().min(period),
            _ => h.lost = true,
        }
    }

    /// Start a request for `op` under a fresh id.
    fn ask(&mut self, ctx: &Ctx<'_>, op: Op) {
        let id = ((ctx.c as u8) << 5) | (self.ids & 0x1f);
        self.ids += 1;
        self.mailbox = None; // registered for the new id only
        self.enqueue_resent = false;
        let seq = self.open();
        self.send_acquire(ctx, (id, seq), op.waits(), ctx.now_h(), ctx.now_h(), false);
    }

    /// Send `lease_acquire` of `id` numbered `seq` for the current operation (again, if it was
    /// sent before).
    fn send_acquire(
        &mut self,
        ctx: &Ctx<'_>,
        (id, seq): (ReqId, u8),
        wait: bool,
        last: Half,
        sent: Half,
        resent: bool,
    ) {
        self.main = Main::Asking {
            id,
            seq,
            wait,
            last,
            sent,
            resent,
        };
        self.net.push(Msg::Req(Req::Acquire {
            id,
            units: ctx.op(self).map_or(1, Op::units),
            wait,
            seq,
            low: self.low(),
        }));
    }

    /// A check-in: `lease_poll` of `id`.
    fn send_poll(&mut self, ctx: &Ctx<'_>, id: ReqId, last: Half) {
        self.net.push(Msg::Req(Req::Poll { id }));
        self.main = Main::Polling {
            id,
            last,
            first: ctx.now_h(),
            sent: ctx.now_h(),
        };
    }

    /// Hold `granted` (its validity set): the release is due after the operation's hold, the
    /// first renewal after a third of the lease, or within half of what is left of the
    /// validity if that is less (`Keepalive::schedule`).
    fn hold(&mut self, ctx: &Ctx<'_>, mut granted: Holding) {
        let now_h = ctx.now_h();
        let op = ctx.op(self);
        granted.units = op.map_or(1, Op::units);
        granted.release_at = ctx.now + op.map_or(0, Op::hold);
        granted.renew_at = now_h
            + ctx
                .cfg
                .period_h()
                .min(granted.valid.saturating_sub(now_h) / 2);
        self.stalled_holding = false;
        self.enqueue_resent = false;
        self.main = Main::Holding(granted);
    }

    /// The acquire failed (`Unavailable`): withdrawn in the background, naming its enqueue
    /// `seq` if that went unanswered (0: a check-in did); the task goes on.
    fn give_up(&mut self, ctx: &Ctx<'_>, id: ReqId, seq: u8) {
        self.withdrawals.push(Withdrawal {
            id,
            pending: seq,
            at: ctx.now_h(),
            sending: false,
        });
        self.next_op();
    }

    fn next_op(&mut self) {
        self.pc += 1;
        self.enqueue_resent = false;
        self.main = Main::Idle;
    }
}
