//! The line on stderr that shows a waiting acquire: queue position and time waited.

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

/// A spinner for one waiting acquire; clears its line when dropped.
#[derive(Debug)]
pub(crate) struct Spinner {
    name: String,
    ahead: Arc<AtomicU64>,
    started: Instant,
    enabled: bool,
    drawn: bool,
}

impl Spinner {
    /// A spinner for waiting on `name`; it draws only if `enabled`.
    pub(crate) fn new(name: &str, enabled: bool) -> Self {
        Spinner {
            name: name.to_owned(),
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
            let place = match self.ahead.load(Ordering::Relaxed) {
                UNKNOWN => "queuing".to_owned(),
                0 => "next in line".to_owned(),
                n => format!("{n} ahead"),
            };
            let line = format!(
                "\r\x1b[2K{frame} waiting for {:?}: {place}, {}",
                self.name,
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
