//! The server: the lease scripts as atomic steps on one semaphore's state
//! (`crates/redsem/lua/lease_prelude.lua` and the operation files).
//!
//! Kept: the records (holder, waiter, tombstone), the queue in arrival order, lease and
//! waiter-lease ends in whole ticks of the server's `TIME`, the slot bitmap, `used`, the last
//! token and `max(last + 1, TIME in µs)`, settle (drop every holder and waiter whose end is not
//! after now) and promote (grant the head while it fits, unclaimed until the waiter lease of its
//! last check-in, and publish `id|token|slots|delay`). Left out: labels, capacity changes,
//! `repair()` (the counters here never disagree, so it would never run), the `next`/`tnext`
//! short cuts, tombstone pruning (a minute is past every horizon), the local hand-off to waiters
//! of the releasing process (one task per client here), group commit.

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
    /// Released (`withdrawn` false) or withdrawn, by the release attempt `attempt` (0: none).
    Tomb { withdrawn: bool, attempt: u8 },
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
}

/// One script run: the configuration, the server's tick, and what it did.
pub(crate) struct Run<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) now: u8,
    pub(crate) fx: Effects,
}

impl Server {
    /// `lease_acquire` of a new or resent request `id` of `client` (`wait`: mode "wait").
    pub(crate) fn acquire(
        &mut self,
        run: &mut Run<'_>,
        id: ReqId,
        units: u8,
        wait: bool,
        client: u8,
    ) -> Reply {
        self.settle(run);
        let (now, cfg) = (run.now, run.cfg);
        match self.records.get_mut(&id) {
            Some(Record::Tomb { .. }) => return Reply::Gone,
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
            Some(Record::Tomb { .. }) | None => Reply::Gone,
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

    /// `lease_release` by the release attempt `attempt` (0: none, as a withdrawal sends).
    pub(crate) fn release(&mut self, run: &mut Run<'_>, id: ReqId, attempt: u8) -> Reply {
        self.settle(run);
        let reply = match self.records.get(&id).cloned() {
            Some(Record::Tomb {
                withdrawn,
                attempt: by,
            }) => {
                if attempt == 0 || by == attempt {
                    run.fx.resent = true;
                    if withdrawn {
                        Reply::Dequeued
                    } else {
                        Reply::Released
                    }
                } else {
                    Reply::NotHeld
                }
            }
            Some(Record::Holder { units, slots, .. }) => {
                self.drop_holder(run.cfg, units, slots);
                self.records.insert(
                    id,
                    Record::Tomb {
                        withdrawn: false,
                        attempt,
                    },
                );
                Reply::Released
            }
            Some(Record::Waiter { .. }) => {
                self.queue.retain(|&w| w != id);
                self.records.insert(
                    id,
                    Record::Tomb {
                        withdrawn: true,
                        attempt,
                    },
                );
                run.fx.withdrawn.push(id);
                Reply::Dequeued
            }
            None => Reply::NotHeld,
        };
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
        self.used == 0
            && self.slots == 0
            && self.queue.is_empty()
            && self
                .records
                .values()
                .all(|r| matches!(r, Record::Tomb { .. }))
    }

    /// Drop every holder and waiter whose end has come, then promote.
    fn settle(&mut self, run: &mut Run<'_>) {
        let now = run.now;
        let due: Vec<(ReqId, Record)> = self
            .records
            .iter()
            .filter(|(_, r)| match r {
                Record::Holder { ends, .. } | Record::Waiter { ends, .. } => *ends <= now,
                Record::Tomb { .. } => false,
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
                Record::Tomb { .. } => {}
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
                .filter_map(|r| match r {
                    Record::Holder { ends, .. } | Record::Waiter { ends, .. } => Some(*ends),
                    Record::Tomb { .. } => None,
                })
                .min();
            if let Some(next) = next {
                wait = wait.min((next + 1).saturating_sub(run.now));
            }
        }
        wait.max(1)
    }
}
