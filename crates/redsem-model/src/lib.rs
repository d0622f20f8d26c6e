//! A model of the lease semaphore's waiting protocol, checked exhaustively with stateright.
//!
//! The model (docs/MODEL.md) has a few clients, each one task running a short list of
//! operations through the client's waiting engine (enqueue, nap, wake-up, poll, re-queue after
//! `GONE`, retries through a lost reply), its keepalive (renewals every third of the lease, the
//! local validity) and its background withdrawal; and one server whose scripts
//! (`lease_acquire`, `lease_poll`, `lease_refresh`, `lease_release`, settle and promote) are
//! atomic steps on its state. Time is discrete: ticks of the server's clock, one millisecond of
//! `TIME` each. Faults: a reply lost, a wake-up lost, a client that stalls, a restart from the
//! AOF, and (switched on apart) a loss of the whole state.
//!
//! [`Bug`] puts back one of the defects the soak was shown to find, so that a test can show
//! the checker finding it.

mod client;
mod model;
mod report;
mod server;

pub use client::{Client, Holding, Main, Msg, Reply, Req, Wake};
pub use model::{Action, LeaseModel, State};
pub use report::{Outcome, check, describe_path};
pub use server::{Mark, Record, Server, Session};

/// A request id: the client's number in the high three bits, its request count below.
pub type ReqId = u8;

/// A client instant in half ticks: the server's tick `t` spans `[2t, 2t + 2)`, and a client acts
/// in the middle of a tick, at `2t + 1` (so it reads its clock after the server's whole
/// millisecond began, and a lease the server counts from its floored `TIME` can end up to half a
/// tick before the client's count of it: the 1 ms gap the soak found).
pub type Half = u16;

/// One operation of a client's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `acquire_many(units)`: queue until granted, hold `hold` ticks, release.
    Acquire { units: u8, hold: u8 },
    /// `try_acquire_many(units)`: once, never queued; if granted, hold `hold` ticks, release.
    Try { units: u8, hold: u8 },
}

impl Op {
    pub fn units(self) -> u8 {
        match self {
            Op::Acquire { units, .. } | Op::Try { units, .. } => units,
        }
    }

    pub fn hold(self) -> u8 {
        match self {
            Op::Acquire { hold, .. } | Op::Try { hold, .. } => hold,
        }
    }

    pub fn waits(self) -> bool {
        matches!(self, Op::Acquire { .. })
    }
}

/// A defect put back into the model: the four the soak was shown to find (docs/SOAK.md), the
/// stale wake-up this model found (docs/MODEL.md) with the halves of its fix taken out, and two
/// defects of the client sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Bug {
    /// The protocol as implemented.
    #[default]
    None,
    /// `lease_acquire` grants whenever the units fit, without checking that nobody waits.
    GrantSkipsQueue,
    /// `drop_holder` forgets to clear the holder's slot bits.
    ReleaseKeepsSlot,
    /// `next_token` is `last + 1`, not `max(last + 1, TIME in µs)`: a state loss sends tokens
    /// back (found only with [`Faults::state_loss`]).
    TokenNotRaised,
    /// The client counts its local validity as `sent + lease`, without the millisecond the
    /// server's floored `TIME` can take off (the gap the 36-minute soak found).
    NoClockStep,
    /// The waiting engine before the stale wake-up's fix (6328a1c, 422ea05): a wake-up's grant
    /// is judged by the answered attempt of the last check-in (`LeaseRequest::handed`'s "more
    /// than half the waiter lease left" and the local validity bound), and taken even by a
    /// request whose enqueue was resent.
    StaleWakeUp,
    /// [`Bug::StaleWakeUp`] with the mailbox's news dropped when the enqueue is resent: the
    /// client-side change weighed first (not enough: the old wake-up can still be on the
    /// pub/sub connection).
    NewsClearedOnResend,
    /// The fix's second half (6328a1c) without its first (422ea05): a wake-up is judged by the
    /// first attempt of the last check-in, but taken even by a request whose enqueue was
    /// resent.
    WakeAfterResend,
    /// The server drops the marks at the low mark too (`<= low`, not `< low`) when it writes a
    /// session record: the mark of the call at the low mark, the one still open, goes at once,
    /// and its resend is applied again (a release's resend answers `NOTHELD`).
    MarkDroppedAtLow,
    /// The client sends a release's resend (`retry_once`) under a new number: it finds no mark
    /// and is applied again (answered `NOTHELD`).
    ReleaseRenumbered,
}

impl Bug {
    pub const ALL: [Bug; 10] = [
        Bug::None,
        Bug::GrantSkipsQueue,
        Bug::ReleaseKeepsSlot,
        Bug::TokenNotRaised,
        Bug::NoClockStep,
        Bug::StaleWakeUp,
        Bug::NewsClearedOnResend,
        Bug::WakeAfterResend,
        Bug::MarkDroppedAtLow,
        Bug::ReleaseRenumbered,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Bug::None => "none",
            Bug::GrantSkipsQueue => "grant-skips-queue",
            Bug::ReleaseKeepsSlot => "release-keeps-slot",
            Bug::TokenNotRaised => "token-not-raised",
            Bug::NoClockStep => "no-clock-step",
            Bug::StaleWakeUp => "stale-wake-up",
            Bug::NewsClearedOnResend => "news-cleared-on-resend",
            Bug::WakeAfterResend => "wake-after-resend",
            Bug::MarkDroppedAtLow => "mark-dropped-at-low",
            Bug::ReleaseRenumbered => "release-renumbered",
        }
    }

    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

/// Which faults the model may inject, and how many in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Faults {
    /// A reply lost on its way back (the client sees the call fail and resends it, same id).
    pub lose_reply: bool,
    /// A wake-up message lost (the waiter's recheck timer makes it poll).
    pub lose_wake: bool,
    /// A client stalls (process and connection frozen) for this many ticks; 0: never.
    pub stall: u8,
    /// The server restarts from its AOF (`appendfsync always`): the state is kept, the clock
    /// goes on, every request and reply on the wire is lost and the pub/sub connection drops.
    pub restart: bool,
    /// The server loses its whole state (a restart without persistence): what README promises
    /// is less, so the capacity and lease rules are judged per state epoch.
    pub state_loss: bool,
    /// Faults in one run, at most.
    pub budget: u8,
}

impl Faults {
    /// No faults at all.
    pub const NONE: Faults = Faults {
        lose_reply: false,
        lose_wake: false,
        stall: 0,
        restart: false,
        state_loss: false,
        budget: 0,
    };
}

/// The size and timing of one model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    pub capacity: u8,
    /// Each client's operations, run one after another.
    pub ops: Vec<Vec<Op>>,
    /// The lease, in ticks.
    pub lease: u8,
    /// The waiter lease, in ticks.
    pub waiter_lease: u8,
    /// The last tick: time does not go further.
    pub horizon: u8,
    pub faults: Faults,
    pub bug: Bug,
}

impl Config {
    /// `clients` clients on a semaphore of `capacity`, each with the operations the small
    /// checks use: client 0 and 2 acquire one unit, client 1 as many as fit (up to 2), and a
    /// client past the third tries one unit; each holds for two ticks.
    pub fn new(clients: usize, capacity: u8) -> Config {
        let ops = (0..clients)
            .map(|c| {
                let units = if c == 1 { capacity.min(2) } else { 1 };
                let op = if c >= 3 {
                    Op::Try { units, hold: 2 }
                } else {
                    Op::Acquire { units, hold: 2 }
                };
                vec![op]
            })
            .collect();
        Config {
            capacity,
            ops,
            lease: 4,
            waiter_lease: 3,
            horizon: 12,
            faults: Faults::NONE,
            bug: Bug::None,
        }
    }

    pub fn with_faults(mut self, faults: Faults) -> Config {
        self.faults = faults;
        self
    }

    pub fn with_bug(mut self, bug: Bug) -> Config {
        self.bug = bug;
        self
    }

    pub fn with_horizon(mut self, horizon: u8) -> Config {
        self.horizon = horizon;
        self
    }

    /// The last `n` clients try (`try_acquire`, never queued) where they would acquire.
    pub fn with_tries(mut self, n: usize) -> Config {
        let clients = self.ops.len();
        for ops in self.ops.iter_mut().skip(clients.saturating_sub(n)) {
            for op in ops.iter_mut() {
                *op = Op::Try {
                    units: op.units(),
                    hold: op.hold(),
                };
            }
        }
        self
    }

    /// Every client runs `n` copies of its operations.
    pub fn with_rounds(mut self, n: usize) -> Config {
        for ops in &mut self.ops {
            let one = ops.clone();
            for _ in 1..n {
                ops.extend(one.iter().copied());
            }
        }
        self
    }

    pub fn clients(&self) -> usize {
        self.ops.len()
    }

    pub(crate) fn lease_h(&self) -> Half {
        2 * Half::from(self.lease)
    }

    pub(crate) fn waiter_lease_h(&self) -> Half {
        2 * Half::from(self.waiter_lease)
    }

    /// `lease::SERVER_CLOCK_STEP`, 1 ms, in half ticks (none with [`Bug::NoClockStep`]).
    pub(crate) fn clock_step_h(&self) -> Half {
        if self.bug == Bug::NoClockStep { 0 } else { 2 }
    }

    /// A wake-up's grant is judged by the first attempt of the last check-in (6328a1c), not
    /// the answered one.
    pub(crate) fn judges_wake_by_first(&self) -> bool {
        !matches!(self.bug, Bug::StaleWakeUp | Bug::NewsClearedOnResend)
    }

    /// A request whose enqueue was resent takes no grant from a wake-up (422ea05).
    pub(crate) fn no_wake_after_resend(&self) -> bool {
        !matches!(
            self.bug,
            Bug::StaleWakeUp | Bug::NewsClearedOnResend | Bug::WakeAfterResend
        )
    }

    /// The keepalive's period, a third of the lease.
    pub(crate) fn period_h(&self) -> Half {
        (self.lease_h() / 3).max(1)
    }

    /// `retry::RETRY_EVERY`: one tick.
    pub(crate) fn retry_h(&self) -> Half {
        2
    }
}
