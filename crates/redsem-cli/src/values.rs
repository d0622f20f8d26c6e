//! Value parsers for the command line: every value a user types is checked here, while
//! parsing, so a bad one is a usage error (exit 2) before anything is sent to Redis.

use std::time::Duration;

use redsem::{MAX_LEASE, MIN_LEASE};

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

/// A permit id as printed by `acquire`: any non-empty text (an unknown id is "not held").
pub(crate) fn id(text: &str) -> Result<String, String> {
    non_empty(text, "the permit id")
}

/// A capacity: a whole number from 1 to 4294967295.
pub(crate) fn limit(text: &str) -> Result<u32, String> {
    let n: i128 = text
        .trim()
        .parse()
        .map_err(|_| "not a whole number".to_owned())?;
    if n < 1 {
        return Err("the limit must be at least 1".to_owned());
    }
    u32::try_from(n).map_err(|_| format!("the limit must be at most {}", u32::MAX))
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

/// Any duration with a unit: `500ms`, `2s`, `1m 30s`.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (write a duration with a unit: 500ms, 2s, 1m)"))
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
    fn leases_are_durations_the_library_can_renew() {
        assert_eq!(lease("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(lease("1m"), Ok(Duration::from_secs(60)));
        assert!(lease("0s").is_err());
        assert!(lease("10ms").is_err());
        assert!(lease("5").is_err());
        assert!(lease("").is_err());
    }

    #[test]
    fn names_must_not_be_empty() {
        assert_eq!(name("jobs"), Ok("jobs".to_owned()));
        assert!(name("").is_err());
    }
}
