//! Value parsers for the command line: every value a user types is checked here, while
//! parsing, so a bad one is a usage error (exit 2) before anything is sent to Redis.

use std::path::PathBuf;
use std::time::Duration;

use redsem::{MAX_LEASE, MAX_PERMITS, MAX_TENANT_LEN, MAX_WEIGHT, MIN_LEASE};

/// A semaphore name: any non-empty text.
pub(crate) fn name(text: &str) -> Result<String, String> {
    non_empty(text, "the name")
}

/// A holder label: any non-empty text.
pub(crate) fn label(text: &str) -> Result<String, String> {
    non_empty(text, "the holder label")
}

/// A key prefix: any non-empty text.
pub(crate) fn prefix(text: &str) -> Result<String, String> {
    non_empty(text, "the prefix")
}

/// A file of CA certificates: any non-empty path (the library reports one it cannot read).
pub(crate) fn file(text: &str) -> Result<PathBuf, String> {
    non_empty(text, "the file name").map(PathBuf::from)
}

/// A permit id as printed by `acquire`: any non-empty text (an unknown id is "not held").
pub(crate) fn id(text: &str) -> Result<String, String> {
    non_empty(text, "the permit id")
}

/// A tenant name: 1 to `MAX_TENANT_LEN` bytes without NUL.
pub(crate) fn tenant(text: &str) -> Result<String, String> {
    let name = non_empty(text, "the tenant")?;
    if name.len() > MAX_TENANT_LEN || name.contains('\0') {
        return Err(format!(
            "the tenant is at most {MAX_TENANT_LEN} bytes without NUL"
        ));
    }
    Ok(name)
}

/// A tenant's weight: a whole number from 1 to `MAX_WEIGHT`.
pub(crate) fn weight(text: &str) -> Result<u32, String> {
    let n = whole(text)?;
    u32::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_WEIGHT).contains(n))
        .ok_or_else(|| format!("the weight must be 1 to {MAX_WEIGHT}"))
}

/// A tenant's cap: a whole number from 1 to 4294967295.
pub(crate) fn cap(text: &str) -> Result<u32, String> {
    let n = whole(text)?;
    if n < 1 {
        return Err("the cap must be at least 1".to_owned());
    }
    u32::try_from(n).map_err(|_| format!("the cap must be at most {}", u32::MAX))
}

/// A capacity: a whole number from 1 to 4294967295.
pub(crate) fn limit(text: &str) -> Result<u32, String> {
    let n = whole(text)?;
    if n < 1 {
        return Err("the limit must be at least 1".to_owned());
    }
    u32::try_from(n).map_err(|_| format!("the limit must be at most {}", u32::MAX))
}

/// A number of permits to take or give back: a whole number from 1 to 4294967295.
pub(crate) fn permits(text: &str) -> Result<u32, String> {
    let n = whole(text)?;
    if n < 1 {
        return Err("the number of permits must be at least 1".to_owned());
    }
    u32::try_from(n).map_err(|_| format!("the number of permits must be at most {}", u32::MAX))
}

/// A first count of permits: a whole number from 0 (closed until permits are added) to
/// 4294967295.
pub(crate) fn initial_permits(text: &str) -> Result<u32, String> {
    let n = whole(text)?;
    if n < 0 {
        return Err("the number of permits must not be negative".to_owned());
    }
    u32::try_from(n).map_err(|_| format!("the number of permits must be at most {}", u32::MAX))
}

/// Permits to add (negative: to take away): a whole number, not 0, within ±(2^53 - 1).
pub(crate) fn delta(text: &str) -> Result<i64, String> {
    let n = whole(text)?;
    if n == 0 {
        return Err("the number of permits to add must not be 0".to_owned());
    }
    i64::try_from(n)
        .ok()
        .filter(|n| (-MAX_PERMITS..=MAX_PERMITS).contains(n))
        .ok_or_else(|| format!("the number of permits to add must be within ±{MAX_PERMITS}"))
}

/// A latch count: a whole number from 1 to 2^53 - 1.
pub(crate) fn count(text: &str) -> Result<u64, String> {
    let n = whole(text)?;
    if n < 1 {
        return Err("the count must be at least 1".to_owned());
    }
    u64::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_PERMITS.unsigned_abs())
        .ok_or_else(|| format!("the count must be at most {MAX_PERMITS}"))
}

/// A lease: a duration the library can renew (30ms up to a year).
pub(crate) fn lease(text: &str) -> Result<Duration, String> {
    let lease = duration(text)?;
    if lease < MIN_LEASE {
        return Err(format!(
            "the lease must be at least {}",
            humantime::format_duration(MIN_LEASE)
        ));
    }
    if lease > MAX_LEASE {
        return Err(format!(
            "the lease must be at most {}",
            humantime::format_duration(MAX_LEASE)
        ));
    }
    Ok(lease)
}

/// `--replica-acks N[/DUR]`: how many replicas must acknowledge each change, and how long
/// the primary may wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    /// Replicas that must acknowledge; 0 turns the option off.
    pub(crate) replicas: usize,
    /// How long the primary waits for them (`WAIT`'s timeout).
    pub(crate) timeout: Duration,
}

/// How long the primary waits for replicas when `--replica-acks` gives no `/DUR`.
pub(crate) const REPLICA_ACKS_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest `/DUR` of `--replica-acks`: under the 5 s in which a command must be
/// answered, or a slow acknowledgement would fail as Redis unreachable.
const MAX_REPLICA_ACKS_TIMEOUT: Duration = Duration::from_secs(4);

/// `N[/DUR]`: a whole number of replicas (0: off), and optionally how long to wait for them
/// (1ms to 4s; default 1s).
pub(crate) fn replica_acks(text: &str) -> Result<ReplicaAcks, String> {
    let (n, timeout) = match text.split_once('/') {
        Some((n, dur)) => (n, duration(dur)?),
        None => (text, REPLICA_ACKS_TIMEOUT),
    };
    let replicas = whole(n)
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            format!("{n:?} is not a number of replicas (write N or N/DUR: 1, 2/250ms)")
        })?;
    if timeout < Duration::from_millis(1) || timeout > MAX_REPLICA_ACKS_TIMEOUT {
        return Err(format!(
            "the time to wait for replicas must be from 1ms to {} (each command must be \
             answered within 5s)",
            humantime::format_duration(MAX_REPLICA_ACKS_TIMEOUT)
        ));
    }
    Ok(ReplicaAcks { replicas, timeout })
}

/// A duration: with a unit (`500ms`, `2s`, `1m 30s`) or a bare number of seconds (`5`,
/// `0.5`), as `timeout(1)` and `flock -w` take it.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>()
        && text.starts_with(|c: char| c.is_ascii_digit() || c == '.')
    {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{text} seconds is not a duration redsem can wait"));
    }
    humantime::parse_duration(text).map_err(|e| {
        let what = match e {
            humantime::DurationError::UnknownUnit { unit, .. } => {
                format!("{text:?} has the unknown unit {unit:?}")
            }
            humantime::DurationError::NumberOverflow => format!("{text:?} is too long"),
            humantime::DurationError::Empty => "the duration is empty".to_owned(),
            _ => format!("{text:?} is not a duration"),
        };
        format!("{what}: {DURATIONS}")
    })
}

/// What [`duration`] accepts, said in its errors.
const DURATIONS: &str = "write a number of seconds (30, 0.5) or numbers with the units ms, s, \
                         m, h or d (500ms, 2s, 1m 30s)";

/// Any whole number, with its sign; a fraction or a word is an error.
fn whole(text: &str) -> Result<i128, String> {
    text.trim()
        .parse()
        .map_err(|_| "not a whole number".to_owned())
}

fn non_empty(text: &str, what: &str) -> Result<String, String> {
    if text.is_empty() {
        Err(format!("{what} must not be empty"))
    } else {
        Ok(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_whole_numbers_from_one() {
        assert_eq!(limit("3"), Ok(3));
        assert_eq!(limit("4294967295"), Ok(u32::MAX));
        assert!(limit("0").is_err());
        assert!(limit("-2").is_err());
        assert!(limit("two").is_err());
        assert!(limit("1.5").is_err());
        assert!(limit("4294967296").is_err());
    }

    #[test]
    fn permits_to_take_or_give_back_are_whole_numbers_from_one() {
        assert_eq!(permits("1"), Ok(1));
        assert_eq!(permits("4294967295"), Ok(u32::MAX));
        assert!(permits("0").is_err());
        assert!(permits("-1").is_err());
        assert!(permits("one").is_err());
        assert!(permits("4294967296").is_err());
    }

    #[test]
    fn a_first_count_of_permits_may_be_zero_but_not_negative() {
        assert_eq!(initial_permits("0"), Ok(0));
        assert_eq!(initial_permits("5"), Ok(5));
        assert!(initial_permits("-1").is_err());
        assert!(initial_permits("2.5").is_err());
    }

    #[test]
    fn permits_to_add_may_be_negative_but_not_zero() {
        assert_eq!(delta("-5"), Ok(-5));
        assert_eq!(delta("7"), Ok(7));
        assert_eq!(delta("9007199254740991"), Ok(MAX_PERMITS));
        assert_eq!(delta("-9007199254740991"), Ok(-MAX_PERMITS));
        assert!(delta("0").is_err());
        assert!(delta("9007199254740992").is_err());
        assert!(delta("-9007199254740992").is_err());
        assert!(delta("many").is_err());
    }

    #[test]
    fn latch_counts_are_whole_numbers_from_one() {
        assert_eq!(count("3"), Ok(3));
        assert_eq!(count("9007199254740991"), Ok(MAX_PERMITS.unsigned_abs()));
        assert!(count("0").is_err());
        assert!(count("-3").is_err());
        assert!(count("9007199254740992").is_err());
        assert!(count("3x").is_err());
    }

    #[test]
    fn leases_are_durations_the_library_can_renew() {
        assert_eq!(lease("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(lease("1m"), Ok(Duration::from_secs(60)));
        assert!(lease("0s").is_err());
        assert!(lease("10ms").is_err());
        assert!(lease("0").is_err());
        assert!(lease("").is_err());
    }

    #[test]
    fn bare_numbers_are_seconds() {
        assert_eq!(duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(duration(" 2 "), Ok(Duration::from_secs(2)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(lease("5"), Ok(Duration::from_secs(5)));
        assert!(duration("-1").is_err());
        assert!(duration("inf").is_err());
        assert!(duration("NaN").is_err());
        assert!(duration("1e400").is_err());
        assert!(duration("soon").is_err());
    }

    #[test]
    fn a_bad_duration_says_what_is_accepted_and_not_the_parsers_unit_list() {
        let why = duration("5x").unwrap_err();
        assert!(why.contains("\"x\"") && why.contains("500ms, 2s"), "{why}");
        assert!(!why.contains("supported units"), "{why}");
    }

    #[test]
    fn replica_acks_are_a_number_and_maybe_a_duration() {
        let acks = |replicas, ms| ReplicaAcks {
            replicas,
            timeout: Duration::from_millis(ms),
        };
        assert_eq!(replica_acks("1"), Ok(acks(1, 1000)));
        assert_eq!(replica_acks("2/250ms"), Ok(acks(2, 250)));
        assert_eq!(replica_acks("0"), Ok(acks(0, 1000)));
        assert_eq!(replica_acks("1/0.5"), Ok(acks(1, 500)));
        assert!(replica_acks("-1").is_err());
        assert!(replica_acks("one").is_err());
        assert!(replica_acks("1/").is_err());
        assert!(replica_acks("1/0s").is_err());
        assert!(replica_acks("1/10s").is_err());
    }

    #[test]
    fn names_must_not_be_empty() {
        assert_eq!(name("jobs"), Ok("jobs".to_owned()));
        assert!(name("").is_err());
    }
}
