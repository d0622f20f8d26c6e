//! Running the checker, and a path told step by step in words.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::client::{Client, Main, Msg, Reply, Req};
use crate::model::{Action, LeaseModel, State};
use crate::server::{Mark, Record, Server};
use crate::{Half, ReqId};

/// What one exhaustive check found.
#[derive(Debug)]
pub struct Outcome {
    pub unique_states: usize,
    pub states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// The `always` properties broken, each with its shortest counterexample.
    pub broken: Vec<(&'static str, Path<State, Action>)>,
    /// The `sometimes` properties reached.
    pub reached: Vec<&'static str>,
    /// The `sometimes` properties never reached.
    pub unreached: Vec<&'static str>,
}

impl Outcome {
    pub fn broke(&self, property: &str) -> bool {
        self.broken
            .iter()
            .any(|(name, _)| name.starts_with(property))
    }

    pub fn counterexample(&self, property: &str) -> Option<&Path<State, Action>> {
        self.broken
            .iter()
            .find(|(name, _)| name.starts_with(property))
            .map(|(_, path)| path)
    }
}

/// Check `model` breadth first on `threads` threads: every reachable state, or until the first
/// `always` property is found broken (breadth first, so with a shortest counterexample).
pub fn check(model: LeaseModel, threads: usize) -> Outcome {
    let properties = model.properties();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads.max(1))
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let mut discoveries = checker.discoveries();
    let mut broken = Vec::new();
    let mut reached = Vec::new();
    let mut unreached = Vec::new();
    for property in &properties {
        match (
            property.expectation.clone(),
            discoveries.remove(property.name),
        ) {
            (Expectation::Sometimes, Some(_)) => reached.push(property.name),
            (Expectation::Sometimes, None) => unreached.push(property.name),
            (_, Some(path)) => broken.push((property.name, path)),
            (_, None) => {}
        }
    }
    Outcome {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        broken,
        reached,
        unreached,
    }
}

/// `path` told one step a line: the tick, what happened, and what it changed.
pub fn describe_path(model: &LeaseModel, path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut out = String::new();
    for pair in steps.windows(2) {
        let (before, Some(action)) = &pair[0] else {
            continue;
        };
        let after = &pair[1].0;
        let _ = writeln!(
            out,
            "t={:<2} {}",
            before.now,
            describe_step(model, before, *action, after)
        );
    }
    if let Some((last, _)) = steps.last() {
        let _ = writeln!(out, "      end: {}", server_summary(&last.server));
        for (c, client) in last.clients.iter().enumerate() {
            let believes = match client.believes(last.now) {
                Some(_) => " (believes it holds)",
                None => "",
            };
            let _ = writeln!(out, "      c{c}: {}{believes}", phase(&client.main));
        }
    }
    out
}

fn describe_step(model: &LeaseModel, before: &State, action: Action, after: &State) -> String {
    match action {
        Action::Tick => format!("tick: the clock moves to t={}", after.now),
        Action::Step(c) | Action::Renew(c) | Action::Withdraw(c) => {
            let who = match action {
                Action::Renew(_) => "keepalive",
                Action::Withdraw(_) => "withdrawal",
                _ => "task",
            };
            let c = usize::from(c);
            let sent = sent(&before.clients[c], &after.clients[c]);
            format!("c{c} {who}: {}{sent}", phase(&after.clients[c].main))
        }
        Action::Exec(c) => {
            let c = usize::from(c);
            let i = before.clients[c]
                .net
                .iter()
                .position(|m| matches!(m, Msg::Req(_)));
            let (req, reply) = match i.map(|i| (before.clients[c].net[i], after.clients[c].net[i]))
            {
                Some((Msg::Req(req), Msg::Rep(_, reply))) => (req, reply),
                _ => return format!("server runs c{c}'s request"),
            };
            let mut woke = String::new();
            for (k, client) in after.clients.iter().enumerate() {
                if client.pubsub != before.clients[k].pubsub
                    && let Some(w) = client.pubsub
                {
                    let _ = write!(
                        woke,
                        "; wakes c{k}: {}|{}|{}|{}",
                        id(w.id),
                        w.token,
                        slots(w.slots),
                        w.delay
                    );
                }
            }
            format!(
                "server runs c{c}'s {} -> {}{woke}; server: {}",
                request(req),
                answer(reply),
                server_summary(&after.server)
            )
        }
        Action::Receive(c) => {
            let c = usize::from(c);
            let reply = match before.clients[c].net.first() {
                Some(Msg::Rep(req, reply)) => {
                    format!("{} to its {}", answer(*reply), request(*req))
                }
                _ => String::from("a reply"),
            };
            let sent = sent(&before.clients[c], &after.clients[c]);
            format!(
                "c{c} reads {reply}: {}{sent}",
                phase(&after.clients[c].main)
            )
        }
        Action::LoseReply(c) => format!("FAULT: a reply to c{c} is lost"),
        Action::Deliver(c) => {
            let routed = match after.clients[usize::from(c)].mailbox {
                Some(w) if before.clients[usize::from(c)].mailbox != Some(w) => "to its mailbox",
                _ => "and drops it (no request of that id waits)",
            };
            format!("c{c} notifier reads the wake-up {routed}")
        }
        Action::LoseWake(c) => format!("FAULT: the wake-up for c{c} is lost"),
        Action::Stall(c) => format!(
            "FAULT: c{c} stalls until t={}",
            after.clients[usize::from(c)]
                .stalled_until
                .unwrap_or(after.now)
        ),
        Action::Restart => String::from("FAULT: the server restarts from its AOF (state kept)"),
        Action::LoseState => String::from("FAULT: the server loses its state"),
        Action::Audit => format!(
            "every client finished; status at t={}: {}",
            before.now + model.cfg.lease.max(model.cfg.waiter_lease),
            server_summary(&after.server)
        ),
    }
}

/// The request a step put on the wire, if any.
fn sent(before: &Client, after: &Client) -> String {
    let new = after.net.len().saturating_sub(before.net.len());
    match after.net.last() {
        Some(Msg::Req(req)) if new > 0 => format!("; sends {}", request(*req)),
        _ => String::new(),
    }
}

fn half(h: Half) -> String {
    if h.is_multiple_of(2) {
        format!("{}", h / 2)
    } else {
        format!("{}.5", h / 2)
    }
}

fn id(id: ReqId) -> String {
    format!("c{}#{}", id >> 5, id & 0x1f)
}

fn slots(bits: u8) -> String {
    let list: Vec<String> = (0..8)
        .filter(|b| bits & (1 << b) != 0)
        .map(|b| b.to_string())
        .collect();
    format!("[{}]", list.join(","))
}

fn request(req: Req) -> String {
    match req {
        Req::Acquire {
            id: r,
            units,
            wait,
            seq,
            low,
        } => format!(
            "lease_acquire({}, {units} unit{}, {}, seq {seq}, low {low})",
            id(r),
            if units == 1 { "" } else { "s" },
            if wait { "wait" } else { "try" }
        ),
        Req::Poll { id: r } => format!("lease_poll({})", id(r)),
        Req::Refresh { id: r, .. } => format!("lease_refresh({})", id(r)),
        Req::Release { id: r, seq, low } => {
            format!("lease_release({}, seq {seq}, low {low})", id(r))
        }
        Req::Withdraw {
            id: r,
            pending,
            low,
        } => format!(
            "lease_release({}, withdrawal, {}low {low})",
            id(r),
            if pending == 0 {
                String::new()
            } else {
                format!("unanswered seq {pending}, ")
            }
        ),
    }
}

fn answer(reply: Reply) -> String {
    match reply {
        Reply::Granted {
            token, slots: s, ..
        } => format!("GRANTED {token} {}", slots(s)),
        Reply::Queued { recheck } => format!("QUEUED (recheck in {recheck})"),
        Reply::Busy => String::from("BUSY"),
        Reply::Gone => String::from("GONE"),
        Reply::Ok => String::from("OK"),
        Reply::NotHeld => String::from("NOTHELD"),
        Reply::Released => String::from("RELEASED"),
        Reply::Dequeued => String::from("DEQUEUED"),
        Reply::Failed => String::from("(failed: unavailable)"),
    }
}

fn phase(main: &Main) -> String {
    match *main {
        Main::Idle => String::from("idle"),
        Main::Asking { id: r, .. } => format!("asking {}", id(r)),
        Main::Napping {
            id: r,
            first,
            sent,
            recheck,
        } => format!(
            "queued {} (checked in at {}{}, recheck at {})",
            id(r),
            half(sent),
            if first == sent {
                String::new()
            } else {
                format!(", first sent at {}", half(first))
            },
            half(recheck)
        ),
        Main::Polling { id: r, .. } => format!("polling {}", id(r)),
        Main::Resend { id: r, at, .. } => format!("sends {} again at {}", id(r), half(at)),
        Main::Holding(h) => format!(
            "holds {} token {} slots {} valid until {}{}{}",
            id(h.id),
            h.token,
            slots(h.slots),
            half(h.valid),
            if h.handed { " (from a wake-up)" } else { "" },
            if h.lost { ", known lost" } else { "" }
        ),
        Main::Releasing { id: r, .. } => format!("releasing {}", id(r)),
        Main::Done => String::from("done"),
    }
}

fn server_summary(server: &Server) -> String {
    let mut out = format!("used {} slots {} queue [", server.used, slots(server.slots));
    let queue: Vec<String> = server.queue.iter().map(|&r| id(r)).collect();
    out.push_str(&queue.join(" "));
    out.push(']');
    for (&r, record) in &server.records {
        match record {
            Record::Holder {
                token,
                slots: s,
                ends,
                ..
            } => {
                let _ = write!(
                    out,
                    " {}=holder(token {token}, {}, ends {ends})",
                    id(r),
                    slots(*s)
                );
            }
            Record::Waiter { ends, .. } => {
                let _ = write!(out, " {}=waiter(ends {ends})", id(r));
            }
        }
    }
    for (c, session) in &server.sessions {
        let marks: Vec<String> = session
            .marks
            .iter()
            .map(|&(n, m)| {
                let letter = match m {
                    Mark::Released => 'R',
                    Mark::Dequeued => 'D',
                    Mark::Withdrawn => 'X',
                };
                format!("{n}={letter}")
            })
            .collect();
        let _ = write!(out, " s:c{c}=low {} [{}]", session.low, marks.join(","));
    }
    if server.epoch > 0 {
        let _ = write!(out, " (state epoch {})", server.epoch);
    }
    out
}
