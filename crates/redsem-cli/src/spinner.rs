//! The line on stderr that shows a wait: what for, the queue position where known, and the
//! time waited.

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

/// A spinner for one wait; clears its line when dropped.
#[derive(Debug)]
pub(crate) struct Spinner {
    /// What is waited for, as shown: `"jobs"`, `latch "ready"`.
    what: String,
    /// Whether the queue position is reported (through [`Spinner::reporter`]).
    positioned: bool,
    ahead: Arc<AtomicU64>,
    started: Instant,
    enabled: bool,
    drawn: bool,
}

impl Spinner {
    /// A spinner for waiting in line for `name`, showing the queue position; it draws only
    /// if `enabled`.
    pub(crate) fn new(name: &str, enabled: bool) -> Self {
        let mut spinner = Spinner::plain(format!("{name:?}"), enabled);
        spinner.positioned = true;
        spinner
    }

    /// A spinner for waiting for `what`, showing the time waited only; it draws only if
    /// `enabled`.
    pub(crate) fn plain(what: String, enabled: bool) -> Self {
        Spinner {
            what,
            positioned: false,
            ahead: Arc::new(AtomicU64::new(UNKNOWN)),
            started: Instant::now(),
            enabled,
            drawn: false,
        }
    }

    /// The progress callback to hand to the acquire: it records the requests ahead.
    pub(crate) fn reporter(&self) -> impl FnMut(u64) + Send + use<> {
        let ahead = self.ahead.clone();
        move |n| ahead.store(n, Ordering::Relaxed)
    }

    /// Redraw until dropped (never returns); does nothing when disabled.
    pub(crate) async fn spin(&mut self) -> Infallible {
        if !self.enabled {
            return std::future::pending().await;
        }
        tokio::time::sleep_until(self.started + QUIET_START).await;
        let mut ticker = tokio::time::interval(TICK);
        let mut frames = FRAMES.iter().cycle();
        loop {
            ticker.tick().await;
            let frame = frames.next().unwrap_or(&' ');
            let place = match (self.positioned, self.ahead.load(Ordering::Relaxed)) {
                (false, _) => String::new(),
                (true, UNKNOWN) => ": queuing".to_owned(),
                (true, 0) => ": next in line".to_owned(),
                (true, n) => format!(": {n} ahead"),
            };
            let line = format!(
                "\r\x1b[2K{frame} waiting for {}{place}, {}",
                self.what,
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
