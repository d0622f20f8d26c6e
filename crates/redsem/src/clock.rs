//! The clock leases are measured on locally: it keeps counting while the machine is suspended
//! (`CLOCK_BOOTTIME` on Linux), so a laptop or VM that wakes up after its leases ended does
//! not believe it still holds them. tokio's timers stop during a suspend; code that sleeps on
//! them re-reads this clock when it wakes.

use std::time::Duration;

/// Time since an arbitrary fixed point, including time spent suspended where the OS allows.
#[cfg(target_os = "linux")]
pub(crate) fn now() -> Duration {
    use nix::time::{ClockId, clock_gettime};
    match clock_gettime(ClockId::CLOCK_BOOTTIME) {
        Ok(t) => Duration::new(
            u64::try_from(t.tv_sec()).unwrap_or(0),
            u32::try_from(t.tv_nsec()).unwrap_or(0),
        ),
        Err(_) => fallback(),
    }
}

/// Time since an arbitrary fixed point (monotonic; suspend handling as the OS provides).
#[cfg(not(target_os = "linux"))]
pub(crate) fn now() -> Duration {
    fallback()
}

fn fallback() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_moves_forward_with_real_time() {
        let a = super::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = super::now();
        assert!(
            b >= a + std::time::Duration::from_millis(20),
            "{a:?} -> {b:?}"
        );
    }
}
