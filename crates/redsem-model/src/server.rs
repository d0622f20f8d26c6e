//! The server: the lease scripts as atomic steps on one semaphore's state
//! (`crates/redsem/lua/lease/`: the prelude's topic files and the operation files).
//!
//! Kept: the records (holder, waiter), one session record per client (its low mark and its
//! marks: `lua/common.lua`'s `session_put`, `session_stale`, `session_mark`), the queue in arrival order, lease and
//! waiter-lease ends in whole ticks of the server's `TIME`, the slot bitmap, `used`, the last
//! token and `max(last + 1, TIME in µs)`, settle (drop every holder and waiter whose end is not
//! after now) and promote (grant the head while it fits, unclaimed until the waiter lease of its
//! last check-in, and publish `id|token|slots|delay`). Left out: labels, capacity changes,
//! `repair()` (the counters here never disagree, so it would never run), the `next`/`tnext`
//! short cuts, the session records' expiry (ten minutes are past every horizon), the local
//! hand-off to waiters of the releasing process (one task per client here), group commit.

use std::collections::BTreeMap;

use crate::client::{Reply, Wake};
use crate::{Bug, Config, ReqId};

/// What the server keeps of one request id (`r:<id>` and its `leases` entry).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Record {
    /// Holds `units` at `slots` (a bitmap) until `ends` (exclusive: due once now reaches it).
    Holder {
        token: u32,
        units: u8,
        slots: u8,
        ends: u8,
    },
    /// Waits in the queue for `units`; its place is kept until `ends`. `client` is its wake
    /// channel; `arrival` numbers the requests in the order the server first saw them (a ghost
    /// for the FIFO rule, not in the real record).
    Waiter {
        units: u8,
        ends: u8,
        client: u8,
        arrival: u8,
    },
}

/// A call's mark in its session's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mark {
    /// `R`: a holder's release; its resend answers `RELEASED`.
    Released,
    /// `D`: a release that withdrew a queued request; its resend answers `DEQUEUED`.
    Dequeued,
    /// `X`: an enqueue withdrawn before it was answered; a copy of it arriving later is `GONE`.
    Withdrawn,
}

/// One client's session record (`s:<session>`): the highest low mark seen, and the marks of
/// the calls at or above it, by sequence number (in order).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Session {
    pub low: u8,
    pub marks: Vec<(u8, Mark)>,
}

impl Session {
    /// A call numbered below the low mark: a late copy of one the client has its answer to.
    fn stale(&self, seq: u8) -> bool {
        seq < self.low
    }

    fn mark(&self, seq: u8) -> Option<Mark> {
        self.marks.iter().find(|&&(n, _)| n == seq).map(|&(_, m)| m)
    }

    /// `session_put`: raise the low mark to the caller's `low`, mark `seq`, and drop the marks
    /// the low mark passed (with [`Bug::MarkDroppedAtLow`], the one at it too).
    fn put(&mut self, cfg: &Config, low: u8, seq: u8, mark: Mark) {
        self.low = self.low.max(low);
        let at = self.marks.partition_point(|&(n, _)| n < seq);
        match self.marks.get_mut(at) {
            Some(slot) if slot.0 == seq => slot.1 = mark,
            _ => self.marks.insert(at, (seq, mark)),
        }
        let low = self.low;
        if cfg.bug == Bug::MarkDroppedAtLow {
            self.marks.retain(|&(n, _)| n > low);
        } else {
            self.marks.retain(|&(n, _)| n >= low);
        }
    }
}

/// One semaphore's state on the server.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Server {
    /// Counts state losses (a ghost: the real server cannot tell).
    pub epoch: u8,
    /// The last fencing token (`tok`); none until the first grant of a state.
    pub tok: Option<u32>,
    pub used: u8,
    /// Bit n set: slot n held.
    pub slots: u8,
    /// Waiter ids, head first.
    pub queue: Vec<ReqId>,
    pub records: BTreeMap<ReqId, Record>,
    /// Session records, by client (one is made at a client's first marked call).
    pub sessions: BTreeMap<u8, Session>,
    /// Requests seen so far (a ghost, kept across a state loss: numbers arrivals).
    pub arrivals: u8,
    /// Grants made in this tick: the server's µs clock is `(tick + 1) * 1000` plus these (at
    /// least a µs passes between two grants). Kept across a state loss: it is the clock.
    pub grants_in_tick: u8,
}

/// What a script did besides its reply, for the model to apply.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Grants made, in order: (id, token, arrival of the request).
    pub(crate) grants: Vec<(ReqId, u32, u8)>,
    /// Wake-ups published: (client, message).
    pub(crate) wakes: Vec<(u8, Wake)>,
    /// Requests queued: (id, client, arrival).
    pub(crate) queued: Vec<(ReqId, u8, u8)>,
    /// Waiters withdrawn by their own client.
    pub(crate) withdrawn: Vec<ReqId>,
    /// A request id seen before was answered as the first time (a resend after a lost reply).
    pub(crate) resent: bool,
    /// A holder's release was applied: (client, its sequence number).
    pub(crate) released: Option<(u8, u8)>,
}

/// One script run: the configuration, the server's tick, and what it did.
pub(crate) struct Run<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) now: u8,
    pub(crate) fx: Effects,
}

impl Server {
    /// `lease_acquire` of a new or resent request `id` of `client`, numbered `seq` in its
    /// session (`wait`: mode "wait").
    pub(crate) fn acquire(
        &mut self,
        run: &mut Run<'_>,
        id: ReqId,
        units: u8,
        wait: bool,
        (client, seq): (u8, u8),
    ) -> Reply {
        self.settle(run);
        let (now, cfg) = (run.now, run.cfg);
        if let Some(session) = self.sessions.get(&client)
            && (session.stale(seq) || session.mark(seq) == Some(Mark::Withdrawn))
        {
            // A late copy of an enqueue that was withdrawn, or answered long ago.
            return Reply::Gone;
        }
        match self.records.get_mut(&id) {
            Some(Record::Holder {
                token, slots, ends, ..
            }) => {
                // Resent: answered as the first time, the lease renewed (claimed) from now.
                *ends = now + cfg.lease;
                run.fx.resent = true;
                return Reply::Granted {
                    token: *token,
                    slots: *slots,
                    epoch: self.epoch,
                };
            }
            Some(Record::Waiter { ends, .. }) => {
                *ends = now + cfg.waiter_lease;
                run.fx.resent = true;
                return Reply::Queued {
                    recheck: self.recheck(run, id),
                };
            }
            None => {}
        }
        let arrival = self.arrivals;
        self.arrivals = self.arrivals.saturating_add(1);
        let nobody_waits = self.queue.is_empty() || cfg.bug == Bug::GrantSkipsQueue;
        if nobody_waits && self.used + units <= cfg.capacity {
            let (token, slots) = self.grant(run, id, units, now + cfg.lease, arrival);
            return Reply::Granted {
                token,
                slots,
                epoch: self.epoch,
            };
        }
        if !wait {
            return Reply::Busy;
        }
        self.queue.push(id);
        self.records.insert(
            id,
            Record::Waiter {
                units,
                ends: now + cfg.waiter_lease,
                client,
                arrival,
            },
        );
        run.fx.queued.push((id, client, arrival));
        Reply::Queued {
            recheck: self.recheck(run, id),
        }
    }

    /// `lease_poll`: a queued request checks in; a grant made to it meanwhile is collected
    /// (claimed: its lease runs from now).
    pub(crate) fn poll(&mut self, run: &mut Run<'_>, id: ReqId) -> Reply {
        self.settle(run);
        let (now, cfg) = (run.now, run.cfg);
        match self.records.get_mut(&id) {
            Some(Record::Holder {
                token, slots, ends, ..
            }) => {
                *ends = now + cfg.lease;
                Reply::Granted {
                    token: *token,
                    slots: *slots,
                    epoch: self.epoch,
                }
            }
            Some(Record::Waiter { ends, .. }) => {
                *ends = now + cfg.waiter_lease;
                Reply::Queued {
                    recheck: self.recheck(run, id),
                }
            }
            None => Reply::Gone,
        }
    }

    /// `lease_refresh`: extend a live lease to now + lease.
    pub(crate) fn refresh(&mut self, run: &mut Run<'_>, id: ReqId) -> Reply {
        self.settle(run);
        match self.records.get_mut(&id) {
            Some(Record::Holder { ends, .. }) => {
                *ends = run.now + run.cfg.lease;
                Reply::Ok
            }
            _ => Reply::NotHeld,
        }
    }

    /// `lease_release` "r": the holder's release of `id`, numbered `seq` in `client`'s session,
    /// whose low mark is `low` (`release_op`). Its resend finds the mark and answers as the
    /// first; any other release of an id it does not hold finds no record and no mark.
    pub(crate) fn release(
        &mut self,
        run: &mut Run<'_>,
        id: ReqId,
        (client, seq, low): (u8, u8, u8),
    ) -> Reply {
        self.settle(run);
        if let Some(session) = self.sessions.get(&client) {
            if session.stale(seq) {
                return Reply::NotHeld;
            }
            match session.mark(seq) {
                Some(Mark::Released) => {
                    run.fx.resent = true;
                    return Reply::Released;
                }
                Some(Mark::Dequeued) => {
                    run.fx.resent = true;
                    return Reply::Dequeued;
                }
                Some(Mark::Withdrawn) | None => {}
            }
        }
        let (reply, mark) = match self.drop_record(run, id) {
            Some(true) => {
                run.fx.released = Some((client, seq));
                (Reply::Released, Mark::Released)
            }
            Some(false) => (Reply::Dequeued, Mark::Dequeued),
            None => return self.promoted(run, Reply::NotHeld),
        };
        self.put_mark(run.cfg, client, low, seq, mark);
        self.promoted(run, reply)
    }

    /// `lease_release` "w": the withdrawal of request `id`, naming its call `pending` that went
    /// unanswered (0: none), by `client` whose low mark is `low`. What the request holds or
    /// where it waits goes; the unanswered call is marked, so a late copy of it is refused.
    pub(crate) fn withdraw(
        &mut self,
        run: &mut Run<'_>,
        id: ReqId,
        (client, pending, low): (u8, u8, u8),
    ) -> Reply {
        self.settle(run);
        let reply = match self.drop_record(run, id) {
            Some(true) => Reply::Released,
            Some(false) => Reply::Dequeued,
            None => Reply::NotHeld,
        };
        if pending != 0 {
            self.put_mark(run.cfg, client, low, pending, Mark::Withdrawn);
        }
        self.promoted(run, reply)
    }

    /// Remove `id`'s holder (`Some(true)`) or waiter (`Some(false)`) record, if any.
    fn drop_record(&mut self, run: &mut Run<'_>, id: ReqId) -> Option<bool> {
        match self.records.remove(&id)? {
            Record::Holder { units, slots, .. } => {
                self.drop_holder(run.cfg, units, slots);
                Some(true)
            }
            Record::Waiter { .. } => {
                self.queue.retain(|&w| w != id);
                run.fx.withdrawn.push(id);
                Some(false)
            }
        }
    }

    fn put_mark(&mut self, cfg: &Config, client: u8, low: u8, seq: u8, mark: Mark) {
        self.sessions
            .entry(client)
            .or_default()
            .put(cfg, low, seq, mark);
    }

    /// Promote, then answer `reply`.
    fn promoted(&mut self, run: &mut Run<'_>, reply: Reply) -> Reply {
        self.promote(run);
        reply
    }

    /// `lease_status`: settle, as every script does first.
    pub(crate) fn status(&mut self, run: &mut Run<'_>) {
        self.settle(run);
    }

    /// The state is lost (a restart without persistence): only the clock goes on.
    pub(crate) fn lose_state(&mut self) {
        *self = Server {
            epoch: self.epoch + 1,
            arrivals: self.arrivals,
            grants_in_tick: self.grants_in_tick,
            ..Server::default()
        };
    }

    /// Nobody holds or waits, and the counters and the bitmap say so too.
    pub fn idle(&self) -> bool {
        self.used == 0 && self.slots == 0 && self.queue.is_empty() && self.records.is_empty()
    }

    /// Drop every holder and waiter whose end has come, then promote.
    fn settle(&mut self, run: &mut Run<'_>) {
        let now = run.now;
        let due: Vec<(ReqId, Record)> = self
            .records
            .iter()
            .filter(|(_, r)| match r {
                Record::Holder { ends, .. } | Record::Waiter { ends, .. } => *ends <= now,
            })
            .map(|(&id, r)| (id, r.clone()))
            .collect();
        for (id, record) in due {
            self.records.remove(&id);
            match record {
                Record::Holder { units, slots, .. } => {
                    self.drop_holder(run.cfg, units, slots);
                }
                Record::Waiter { .. } => self.queue.retain(|&w| w != id),
            }
        }
        self.promote(run);
    }

    /// Grant every head of the queue that fits, in order. A grant woken by message is
    /// unclaimed: its lease ends when the waiter lease of its last check-in would have (never
    /// later than a lease from now, and at least a tick from now).
    fn promote(&mut self, run: &mut Run<'_>) {
        let (now, cfg) = (run.now, run.cfg);
        while let Some(&head) = self.queue.first() {
            let Some(&Record::Waiter {
                units,
                ends: place_ends,
                client,
                arrival,
            }) = self.records.get(&head)
            else {
                self.queue.remove(0);
                continue;
            };
            if self.used + units > cfg.capacity {
                return;
            }
            let checked_in = place_ends.saturating_sub(cfg.waiter_lease);
            let ends = place_ends.min(now + cfg.lease).max(now + 1);
            self.queue.remove(0);
            let (token, slots) = self.grant(run, head, units, ends, arrival);
            let wake = Wake {
                id: head,
                token,
                slots,
                delay: now.saturating_sub(checked_in),
                epoch: self.epoch,
            };
            run.fx.wakes.push((client, wake));
        }
    }

    /// Grant `units` to `id` until `ends`: the next token, the lowest free slots.
    fn grant(
        &mut self,
        run: &mut Run<'_>,
        id: ReqId,
        units: u8,
        ends: u8,
        arrival: u8,
    ) -> (u32, u8) {
        let last = self.tok.unwrap_or(0);
        // (The clock starts at 1 ms, not 0: a real `TIME` is never below the tokens.)
        let clock_us = (u32::from(run.now) + 1) * 1000 + u32::from(self.grants_in_tick);
        self.grants_in_tick = self.grants_in_tick.saturating_add(1);
        let token = match run.cfg.bug {
            Bug::TokenNotRaised => last + 1,
            _ => (last + 1).max(clock_us),
        };
        self.tok = Some(token);
        let mut slots = 0u8;
        let mut taken = 0;
        for bit in 0..8 {
            if taken == units {
                break;
            }
            if (self.slots | slots) & (1 << bit) == 0 {
                slots |= 1 << bit;
                taken += 1;
            }
        }
        self.slots |= slots;
        self.used += units;
        self.records.insert(
            id,
            Record::Holder {
                token,
                units,
                slots,
                ends,
            },
        );
        run.fx.grants.push((id, token, arrival));
        (token, slots)
    }

    fn drop_holder(&mut self, cfg: &Config, units: u8, slots: u8) {
        if cfg.bug != Bug::ReleaseKeepsSlot {
            self.slots &= !slots;
        }
        self.used = self.used.saturating_sub(units);
    }

    /// `recheck_ms`: a third of the waiter lease, and for the head no later than just past the
    /// first lease end (an expired holder is noticed only by a script).
    fn recheck(&self, run: &Run<'_>, id: ReqId) -> u8 {
        let mut wait = run.cfg.waiter_lease / 3;
        if self.queue.first() == Some(&id) {
            let next = self
                .records
                .values()
                .map(|r| match r {
                    Record::Holder { ends, .. } | Record::Waiter { ends, .. } => *ends,
                })
                .min();
            if let Some(next) = next {
                wait = wait.min((next + 1).saturating_sub(run.now));
            }
        }
        wait.max(1)
    }
}
