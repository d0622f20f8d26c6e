//! What a general native path works on in memory (general.rs): its reply, and the state's
//! records as lease/layout.lua's parse() reads them (the sorted sets: crate::zset).

use crate::record::{Native, decimal};
pub(super) use crate::reply::{Reply, bulk, int, send};

use super::general::MAX_UNITS;

/// The largest integer a Lua number holds exactly.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// An integer score as the Lua reads it (`tonumber(ZSCORE ...)`), or None if not a plain one.
pub(super) fn integral(score: f64) -> Native<i64> {
    (score.fract() == 0.0 && score.abs() <= EXACT).then_some(score as i64)
}

/// A record of the state hash, as lease/layout.lua's parse() reads it (only plain ones).
#[derive(Debug)]
pub(super) enum Record {
    /// "h|token|units|granted at|lease|slots|label": the slots and the label.
    Holder {
        k: u64,
        slots: Vec<u64>,
        label: Vec<u8>,
    },
    /// "w|units|since|lease|waiter lease|len(channel)|channel label".
    Waiter {
        k: u64,
        lease: u64,
        wl: u64,
        channel: Vec<u8>,
        label: Vec<u8>,
    },
}

/// Slots as runs, "0-2,7": only runs of plain numbers.
pub(super) fn slots_of(text: &[u8]) -> Native<Vec<u64>> {
    if let Some(one) = decimal(text) {
        return Some(vec![one]);
    }
    let mut slots = Vec::new();
    for run in text.split(|&c| c == b',') {
        let mut ends = run.splitn(2, |&c| c == b'-');
        let first = decimal(ends.next()?)?;
        let last = match ends.next() {
            Some(last) => decimal(last)?,
            None => first,
        };
        if last < first || last - first > MAX_UNITS {
            return None;
        }
        slots.extend(first..=last);
    }
    Some(slots)
}

/// A record's seven `|`-separated fields (the last takes the rest), as parse() and the fast
/// release read them.
pub(super) fn seven_fields(raw: &[u8]) -> Option<[&[u8]; 7]> {
    let mut p = raw.splitn(7, |&c| c == b'|');
    let mut out = [&raw[..0]; 7];
    for field in &mut out {
        *field = p.next()?;
    }
    Some(out)
}

/// parse(raw): Some(None) for no record; None (declined) for one read otherwise than plainly.
pub(super) fn parse(raw: Option<&[u8]>) -> Native<Option<Record>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    match raw.first() {
        Some(b'h') => {
            let [_, t, k, a, lease, slots, label] = seven_fields(raw)?;
            decimal(t)?;
            decimal(a)?;
            decimal(lease)?;
            let (k, slots) = (decimal(k)?, slots_of(slots)?);
            Some(Some(Record::Holder {
                k,
                slots,
                label: label.to_vec(),
            }))
        }
        Some(b'w') => {
            let [_, k, since, lease, wl, clen, rest] = seven_fields(raw)?;
            decimal(since)?;
            let (k, lease, wl, clen) = (
                decimal(k)?,
                decimal(lease)?,
                decimal(wl)?,
                decimal(clen)? as usize,
            );
            if clen > rest.len() {
                return None;
            }
            Some(Some(Record::Waiter {
                k,
                lease,
                wl,
                channel: rest[..clen].to_vec(),
                label: rest[clen..].to_vec(),
            }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_score_is_read_as_the_lua_reads_it() {
        assert_eq!(integral(1_500.0), Some(1_500));
        assert_eq!(integral(-7.0), Some(-7));
        assert_eq!(integral(EXACT), Some(1 << 53));
        for odd in [
            1.5,
            -0.25,
            EXACT * 2.0,
            -EXACT * 2.0,
            f64::INFINITY,
            f64::NAN,
        ] {
            assert_eq!(integral(odd), None, "{odd}");
        }
    }

    #[test]
    fn slots_are_read_only_as_runs_of_plain_numbers() {
        assert_eq!(slots_of(b"7"), Some(vec![7]));
        assert_eq!(slots_of(b"0-2,7"), Some(vec![0, 1, 2, 7]));
        assert_eq!(slots_of(b"3,5-6"), Some(vec![3, 5, 6]));
        assert_eq!(slots_of(b"4-4"), Some(vec![4]));
        let widest = format!("10-{}", 10 + MAX_UNITS);
        assert_eq!(
            slots_of(widest.as_bytes()).map(|s| s.len() as u64),
            Some(MAX_UNITS + 1)
        );
        let wider = format!("10-{}", 11 + MAX_UNITS);
        for odd in [
            &b""[..],
            b"2-1",
            b"1,",
            b",1",
            b"1-",
            b"-1",
            b"1-2-3",
            b"a",
            b"1,x-2",
            wider.as_bytes(),
        ] {
            assert_eq!(slots_of(odd), None, "{}", String::from_utf8_lossy(odd));
        }
    }

    #[test]
    fn a_record_is_split_in_seven_fields_the_last_taking_the_rest() {
        assert_eq!(
            seven_fields(b"w|1|2|3|4|5|c|h|x"),
            Some([&b"w"[..], b"1", b"2", b"3", b"4", b"5", b"c|h|x"])
        );
        assert_eq!(
            seven_fields(b"||||||"),
            Some([&b""[..], b"", b"", b"", b"", b"", b""])
        );
        assert_eq!(seven_fields(b"h|1|2|3|4|5"), None);
    }

    #[test]
    fn holder_and_waiter_records_are_parsed_as_the_lua_parses_them() {
        assert!(matches!(parse(None), Some(None)));
        match parse(Some(b"h|17|2|100|5000|3-4|lbl")) {
            Some(Some(Record::Holder { k, slots, label })) => {
                assert_eq!((k, slots, label), (2, vec![3, 4], b"lbl".to_vec()));
            }
            other => panic!("{other:?}"),
        }
        match parse(Some(b"w|2|100|5000|300|4|c0:xlbl")) {
            Some(Some(Record::Waiter {
                k,
                lease,
                wl,
                channel,
                label,
            })) => {
                assert_eq!((k, lease, wl), (2, 5000, 300));
                assert_eq!((channel, label), (b"c0:x".to_vec(), b"lbl".to_vec()));
            }
            other => panic!("{other:?}"),
        }
        // A channel as long as the rest: no label.
        match parse(Some(b"w|1|100|5000|300|2|c0")) {
            Some(Some(Record::Waiter { channel, label, .. })) => {
                assert_eq!((channel, label), (b"c0".to_vec(), Vec::new()));
            }
            other => panic!("{other:?}"),
        }
        for odd in [
            &b""[..],
            b"x|17|1|100|5000|3|",
            b"h|17|1|100|5000|3",
            b"h|1x|1|100|5000|3|",
            b"h|17|x|100|5000|3|",
            b"h|17|1|1.5|5000|3|",
            b"h|17|1|100|-1|3|",
            b"h|17|1|100|5000|3-|",
            b"w|1|100|5000|300|3|c0",
            b"w|x|100|5000|300|2|c0",
            b"w|1|1e2|5000|300|2|c0",
            b"w|1|100|x|300|2|c0",
            b"w|1|100|5000|x|2|c0",
            b"w|1|100|5000|300|x|c0",
        ] {
            assert!(
                parse(Some(odd)).is_none(),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }
    }

    #[test]
    fn replies_are_built_as_given() {
        assert!(matches!(bulk(b"OK"), Reply::Bulk(b) if b == b"OK"));
        assert!(matches!(int(7), Reply::Int(7)));
    }
}
