//! What stderr shows of a wait: on a terminal, a spinner line with what is waited for, the
//! queue position where known, and the time waited; off a terminal, one line when the wait
//! starts (queued, or still waiting after a moment), so logs show why a job sat idle.

use std::convert::Infallible;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::output;

/// Frames of the spinner, one per tick.
const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
/// Redraw this often.
const TICK: Duration = Duration::from_millis(100);
/// Draw nothing for a wait shorter than this, so a quick grant does not flash a line.
const QUIET_START: Duration = Duration::from_millis(300);
/// Not yet told the queue position.
const UNKNOWN: u64 = u64::MAX;

/// How a wait is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// A spinner redrawn in place (stderr is a terminal).
    Spinner,
    /// One line when the wait starts (stderr is a file or a pipe).
    Line,
    /// Nothing (`--quiet`, or no wait).
    Off,
}

/// A spinner for one wait; clears its line when dropped.
#[derive(Debug)]
pub(crate) struct Spinner {
    /// What is waited for, as shown: `"jobs"`, `latch "ready"`.
    what: String,
    /// Whether the queue position is reported (through [`Spinner::reporter`]).
    positioned: bool,
    ahead: Arc<AtomicU64>,
    started: Instant,
    progress: Progress,
    drawn: bool,
}

impl Spinner {
    /// A spinner for waiting in line for `name`, showing the queue position.
    pub(crate) fn new(name: &str, progress: Progress) -> Self {
        let mut spinner = Spinner::plain(format!("{name:?}"), progress);
        spinner.positioned = true;
        spinner
    }

    /// A spinner for waiting for `what`, showing the time waited only.
    pub(crate) fn plain(what: String, progress: Progress) -> Self {
        Spinner {
            what,
            positioned: false,
            ahead: Arc::new(AtomicU64::new(UNKNOWN)),
            started: Instant::now(),
            progress,
            drawn: false,
        }
    }

    /// Where the wait stands: `: 3 ahead`, `: next in line`, `: queuing`, or nothing.
    fn place(&self) -> String {
        match (self.positioned, self.ahead.load(Ordering::Relaxed)) {
            (false, _) => String::new(),
            (true, UNKNOWN) => ": queuing".to_owned(),
            (true, 0) => ": next in line".to_owned(),
            (true, n) => format!(": {n} ahead"),
        }
    }

    /// The progress callback to hand to the acquire: it records the requests ahead, and off
    /// a terminal writes the waiting line the first time (when the request is queued).
    pub(crate) fn reporter(&self) -> impl FnMut(u64) + Send + use<> {
        let ahead = self.ahead.clone();
        let mut announce = (self.progress == Progress::Line).then(|| self.what.clone());
        move |n| {
            ahead.store(n, Ordering::Relaxed);
            if let Some(what) = announce.take() {
                let place = if n == 0 {
                    "next in line".to_owned()
                } else {
                    format!("{n} ahead")
                };
                let line = format!("redsem: waiting for {what}: {place}\n");
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(line.as_bytes()).and_then(|()| err.flush());
            }
        }
    }

    /// Show the wait until dropped (never returns): redraw the spinner, or write the one line
    /// when still waiting after a moment (a wait whose position is reported is announced by
    /// its [`Spinner::reporter`] instead).
    pub(crate) async fn spin(&mut self) -> Infallible {
        match self.progress {
            Progress::Off => std::future::pending().await,
            // A positioned wait is announced by its reporter, when queued.
            Progress::Line if self.positioned => std::future::pending().await,
            Progress::Line => {
                tokio::time::sleep_until(self.started + QUIET_START).await;
                let line = format!("redsem: waiting for {}\n", self.what);
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(line.as_bytes()).and_then(|()| err.flush());
                std::future::pending().await
            }
            Progress::Spinner => self.redraw().await,
        }
    }

    async fn redraw(&mut self) -> Infallible {
        tokio::time::sleep_until(self.started + QUIET_START).await;
        let mut ticker = tokio::time::interval(TICK);
        let mut frames = FRAMES.iter().cycle();
        loop {
            ticker.tick().await;
            let frame = frames.next().unwrap_or(&' ');
            let line = format!(
                "\r\x1b[2K{frame} waiting for {}{}, {}",
                self.what,
                self.place(),
                output::duration(self.started.elapsed())
            );
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(line.as_bytes()).and_then(|()| err.flush());
            self.drawn = true;
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(b"\r\x1b[2K").and_then(|()| err.flush());
        }
    }
}
