//! The wake-up message, in one place on the Rust side (the scripts in `lua/` write it).
//!
//! A script that grants or may grant a queued request publishes, on the channel of the client
//! that queued it, `<id>` (check in now) or `<id>|<news>`. A lease grant's news is
//! `token|slot,slot,...|delay`: the grant itself, and the milliseconds from the waiter's last
//! check-in to the grant (both in server time). A release made by the same client hands the
//! same text over locally ([`crate::notify::Notifier::deliver`]).

use std::time::Duration;

/// The request id a wake-up is for, and its news (what follows the first `|`), if any.
pub(crate) fn split(payload: &str) -> (&str, Option<&str>) {
    match payload.split_once('|') {
        Some((id, news)) => (id, Some(news)),
        None => (payload, None),
    }
}

/// A lease grant carried by a wake-up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LeaseGrant {
    pub(crate) token: u64,
    pub(crate) slots: Vec<u32>,
    /// From the waiter's last check-in to the grant, in server time.
    pub(crate) delay: Duration,
}

impl LeaseGrant {
    /// Read the news of a wake-up; `None` unless it is exactly a lease grant.
    pub(crate) fn parse(news: &str) -> Option<LeaseGrant> {
        let mut parts = news.split('|');
        let token = parts.next()?.parse().ok()?;
        let slots = parts
            .next()?
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<u32>, _>>()
            .ok()?;
        let delay = Duration::from_millis(parts.next()?.parse().ok()?);
        if parts.next().is_some() {
            return None;
        }
        Some(LeaseGrant {
            token,
            slots,
            delay,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_up_is_an_id_and_maybe_news() {
        assert_eq!(split("abc"), ("abc", None));
        assert_eq!(split("abc|5|0|1"), ("abc", Some("5|0|1")));
        assert_eq!(split("abc|"), ("abc", Some("")));
    }

    #[test]
    fn lease_grants_are_read_from_wake_up_news() {
        assert_eq!(
            LeaseGrant::parse("1790000000000001|0,3|12"),
            Some(LeaseGrant {
                token: 1_790_000_000_000_001,
                slots: vec![0, 3],
                delay: Duration::from_millis(12),
            })
        );
        for bad in ["", "5", "5|0", "5|x|1", "5|0|-1", "5|0|1|2", "x|0|1"] {
            assert_eq!(LeaseGrant::parse(bad), None, "{bad:?}");
        }
    }
}
