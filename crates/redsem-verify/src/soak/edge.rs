//! Holds that run to their lease end, and looks at the server beside them (docs/SOAK.md:
//! the edge holds in "What runs", and the rule `lease_end`).
//!
//! A hold of the soak's usual rounds lasts a few milliseconds and is renewed, so a lease
//! rarely ends while someone believes it held: a server that ends leases a little early
//! went unseen. An *edge hold* takes every unit of a semaphore under a short lease
//! ([`EDGE_LEASE`]) and keeps it until its local validity is about to end: without
//! keep-alive (`expire`), `forget()`ed (`forget`), or kept alive until the nemesis freezes
//! its client's proxy (`stall`, the `lease_end` fault). In the last milliseconds of the
//! validity the task tries for a unit of the same semaphore on a client of its own that
//! reaches the server directly (a grant then is two holders at once), and reads what the
//! server stores for the hold (its lease end and `TIME`, on a connection of its own): the
//! `lease_end` rule compares it with what the holder believes. One edge hold runs at a time,
//! with a pause between (so the semaphores are mostly free for the other rounds).

use std::time::Duration;

use redsem::{LeasePermit, PermitId};

use super::history::{Audit, LeaseOp, Record};
use super::look::leases_key;
use super::task::{EdgeGate, Progress, Task, outcome};

/// How long before its local validity ends a hold starts probing.
const APPROACH: Duration = Duration::from_millis(7);

/// At most this many probes (each with a look at the server) per approach.
const MOST_PROBES: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Expire,
    Forget,
    Stall,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Expire => "expire",
            Mode::Forget => "forget",
            Mode::Stall => "stall",
        }
    }
}

/// The hold being approached: a permit, or the validity of one that was forgotten.
enum Held<'a> {
    Permit(&'a LeasePermit),
    Forgotten(u64),
}

impl Task {
    /// The local validity the holder believes now, if it still does (not known lost, and
    /// still ahead).
    fn believed(&self, held: &Held<'_>) -> Option<u64> {
        match held {
            Held::Permit(permit) => permit.is_held().then(|| self.validity(permit)).flatten(),
            Held::Forgotten(until) => (self.rec.now() < *until).then_some(*until),
        }
    }

    /// Look at what the server stores for the grant `id` of `op`, beside `believed` (read
    /// just before), and record it in `op.audits`. Nothing without an auditor or a belief.
    pub async fn audit(&mut self, op: &mut LeaseOp, id: &PermitId, believed: Option<u64>) {
        let Some(believed) = believed else { return };
        let Some(auditor) = self.edge.as_mut().and_then(|e| e.auditor.as_mut()) else {
            return;
        };
        let t0 = self.rec.now();
        let Some((server_us, end_ms)) = auditor.look(&leases_key(&op.name), id.as_str()).await
        else {
            return;
        };
        op.audits.push(Audit {
            via: "read".into(),
            believed_us: believed,
            t0_us: t0,
            t1_us: self.rec.now() + 1,
            server_us: Some(server_us),
            end_ms,
        });
    }

    /// An edge hold (see the module): every unit of one semaphore, held to its lease end.
    pub async fn edge_round(&mut self) {
        let Some(kit) = self.edge.as_ref() else {
            return;
        };
        let gate = std::sync::Arc::clone(&kit.gate);
        let i = self.rng.below(kit.leases.len() as u64) as usize;
        let mode = match self.rng.below(100) {
            0..45 => Mode::Expire,
            45..75 => Mode::Forget,
            _ => Mode::Stall,
        };
        let sem = kit.leases[i][usize::from(mode != Mode::Expire)].clone();
        let units = sem.capacity();
        let mut op = LeaseOp {
            client: self.client,
            task: self.task,
            name: sem.name().to_owned(),
            op: "timeout".into(),
            units,
            edge: Some(mode.name().into()),
            ..LeaseOp::default()
        };
        let wait = Duration::from_millis(20 + self.rng.below(300));
        let watch = Progress::new(&self.rec);
        op.inv_us = self.rec.now();
        let result = sem
            .acquire_with_progress(units, Some(wait), watch.reporter())
            .await;
        op.ret_us = self.rec.now();
        watch.finish(&mut op);
        let permit = match result {
            Ok(permit) => permit,
            Err(e) => {
                op.outcome = outcome(&e);
                self.rec.push(Record::Lease(op));
                gate.finish();
                return;
            }
        };
        op.outcome = "ok".into();
        op.token = Some(permit.token().get());
        op.id = Some(permit.id().as_str().to_owned());
        op.slots = permit.slots().to_vec();
        let id = permit.id().clone();
        let mut valid_until = self.validity(&permit).unwrap_or(op.ret_us);
        let believed = self.believed(&Held::Permit(&permit));
        self.audit(&mut op, &id, believed).await;
        match mode {
            Mode::Forget => {
                // Nobody releases it: the server keeps it until its lease ends, which the
                // holder may count on until its local validity ends.
                permit.forget();
                op.end = Some("forget".into());
                self.approach(&mut op, &id, &Held::Forgotten(valid_until), i, false)
                    .await;
            }
            Mode::Expire => {
                // Now and then a refresh sent in the last milliseconds of the validity.
                let late = self.rng.chance(0.3);
                let seen = self
                    .approach(&mut op, &id, &Held::Permit(&permit), i, late)
                    .await;
                valid_until = valid_until.max(seen.unwrap_or(0));
                self.finish_edge(&mut op, permit).await;
            }
            Mode::Stall => {
                let seen = self.stall(&mut op, &id, &permit, i, &gate).await;
                valid_until = valid_until.max(seen.unwrap_or(0));
                self.finish_edge(&mut op, permit).await;
            }
        }
        op.valid_until_us = Some(valid_until);
        self.rec.push(Record::Lease(op));
        gate.finish();
    }

    /// After the approach: wait a moment for the local loss (its timer fires just after the
    /// validity ends), then release (answered at once, "not held", once lost).
    async fn finish_edge(&mut self, op: &mut LeaseOp, permit: LeasePermit) {
        let _ = tokio::time::timeout(Duration::from_millis(5), permit.lost()).await;
        if op.lost_us.is_none() && !permit.is_held() {
            op.lost_us = Some(self.rec.now());
        }
        self.end_hold(op, permit, false).await;
    }

    /// A `stall` hold: kept alive for 0.4–1.2 s, looked at every 100 ms, unless its renewals
    /// stop (the nemesis froze its proxy: `lease_end`) and its validity comes to its end:
    /// then the approach. Returns the latest validity seen ahead.
    async fn stall(
        &mut self,
        op: &mut LeaseOp,
        id: &PermitId,
        permit: &LeasePermit,
        i: usize,
        gate: &EdgeGate,
    ) -> Option<u64> {
        gate.post_stall(self.client);
        let until = self.rec.now() + 400_000 + self.rng.below(800_000);
        let approach = u64::try_from(APPROACH.as_micros()).unwrap_or(0);
        let mut latest = None;
        while let Some(v) = self.believed(&Held::Permit(permit)) {
            latest = latest.max(Some(v));
            let now = self.rec.now();
            if now >= until {
                break;
            }
            let wake = until.min(v.saturating_sub(approach)).min(now + 100_000);
            let at = self.rec.start + Duration::from_micros(wake);
            tokio::select! {
                () = tokio::time::sleep_until(at.into()) => {}
                () = permit.lost() => {
                    op.lost_us = Some(self.rec.now());
                    break;
                }
            }
            let believed = self.believed(&Held::Permit(permit));
            match believed {
                Some(v) if self.rec.now() + approach >= v => {
                    // The renewals stopped: the lease is about to end.
                    let seen = self.approach(op, id, &Held::Permit(permit), i, false).await;
                    latest = latest.max(seen);
                    break;
                }
                _ => self.audit(op, id, believed).await,
            }
        }
        latest
    }

    /// Around the end of `held`'s local validity, from [`APPROACH`] before it to just after
    /// it: a look at the server and a try for one unit on the direct client, over and over
    /// (and once, if `refresh_late`, a refresh of the permit in its last 3 ms). Returns the
    /// latest validity seen ahead.
    async fn approach(
        &mut self,
        op: &mut LeaseOp,
        id: &PermitId,
        held: &Held<'_>,
        i: usize,
        mut refresh_late: bool,
    ) -> Option<u64> {
        let approach = u64::try_from(APPROACH.as_micros()).unwrap_or(0);
        let mut latest = None;
        // (A renewal that got through after all moves the end: approached again, twice at
        // most.)
        'again: for _ in 0..3 {
            let Some(v) = self.believed(held) else {
                return latest;
            };
            latest = latest.max(Some(v));
            let at = self.rec.start + Duration::from_micros(v.saturating_sub(approach));
            tokio::time::sleep_until(at.into()).await;
            for _ in 0..MOST_PROBES {
                let believed = self.believed(held);
                if self.rec.now() > v + 500 {
                    break;
                }
                if believed.is_some_and(|b| b > v + approach) {
                    // Renewed after all (a stall whose renewal got through): approach the
                    // new end.
                    continue 'again;
                }
                self.audit(op, id, believed).await;
                if let (true, Some(b), Held::Permit(permit)) = (refresh_late, believed, held)
                    && b.saturating_sub(self.rec.now()) < 3000
                {
                    refresh_late = false;
                    self.late_refresh(op, permit, b).await;
                    continue 'again;
                }
                self.probe(i).await;
            }
            return latest;
        }
        latest
    }

    /// A refresh of `permit`, believed valid until `believed`, in the last milliseconds of
    /// its validity; "not held" is recorded as a look at the server (via `refresh`).
    async fn late_refresh(&mut self, op: &mut LeaseOp, permit: &LeasePermit, believed: u64) {
        let t0 = self.rec.now();
        let r = permit.refresh().await;
        let t1 = self.rec.now() + 1;
        op.refresh = Some(match &r {
            Ok(()) => "ok".into(),
            Err(e) => outcome(e),
        });
        if let Err(redsem::Error::LeaseLost { .. }) = r {
            // Known lost before it was sent is answered at once, after the validity ended:
            // then `believed` is before `t0`, which the rule allows.
            op.lost_us.get_or_insert(t1);
            op.audits.push(Audit {
                via: "refresh".into(),
                believed_us: believed,
                t0_us: t0,
                t1_us: t1,
                server_us: None,
                end_ms: None,
            });
        }
    }

    /// Try for one unit of semaphore `i` on the direct client; a grant is released at once.
    async fn probe(&mut self, i: usize) {
        let Some(sem) = self.edge.as_ref().map(|e| e.probes[i].clone()) else {
            return;
        };
        let mut op = LeaseOp {
            client: self.client,
            task: self.task,
            name: sem.name().to_owned(),
            op: "probe".into(),
            units: 1,
            ..LeaseOp::default()
        };
        op.inv_us = self.rec.now();
        let r = sem.try_acquire().await;
        op.ret_us = self.rec.now();
        match r {
            Ok(permit) => {
                op.outcome = "ok".into();
                op.token = Some(permit.token().get());
                op.id = Some(permit.id().as_str().to_owned());
                op.slots = permit.slots().to_vec();
                op.valid_until_us = Some(self.validity(&permit).unwrap_or(op.ret_us));
                self.end_hold(&mut op, permit, false).await;
            }
            Err(e) => op.outcome = outcome(&e),
        }
        self.rec.push(Record::Lease(op));
    }
}
