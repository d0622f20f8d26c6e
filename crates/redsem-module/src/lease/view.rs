//! What a general native path works on in memory (general.rs): its reply, the two sorted
//! sets as the call's changes over the keys, and the state's records as lease/layout.lua's
//! parse() reads them.

use crate::api::{
    self, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, key_type, raw,
};
use crate::encoding;
use crate::record::{Native, decimal, decimal_text, join};
use crate::replicate::Effects;

use super::general::MAX_UNITS;

/// The largest integer a Lua number holds exactly.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// A reply, built while the call is worked out and sent once it is written.
#[derive(Debug)]
pub(super) enum Reply {
    Bulk(Vec<u8>),
    Int(i64),
    Array(Vec<Reply>),
}

pub(super) fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(b.to_vec())
}

pub(super) fn int(n: u64) -> Reply {
    Reply::Int(n as i64)
}

pub(super) unsafe fn send(ctx: *mut RedisModuleCtx, reply: &Reply) {
    match reply {
        Reply::Bulk(b) => api::reply_bulk(ctx, b),
        Reply::Int(n) => api::reply_integer(ctx, *n),
        Reply::Array(items) => {
            api::reply_array(ctx, items.len());
            for item in items {
                send(ctx, item);
            }
        }
    }
}

/// A sorted set as the call sees it: the key, and the call's changes over it (a member's
/// new score, or None: removed), written at the end.
pub(super) struct Zset {
    pub(super) key: *mut RedisModuleKey,
    pub(super) changes: Vec<(Vec<u8>, Option<f64>)>,
    /// The first members as stored, read a window at a time by first() (`all`: to the end).
    heads: Vec<(f64, Vec<u8>)>,
    all: bool,
}

impl Zset {
    pub(super) unsafe fn stored_score(
        &self,
        ctx: *mut RedisModuleCtx,
        member: &[u8],
    ) -> Option<f64> {
        if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY {
            return None;
        }
        let m = Str::new(ctx, member);
        let mut score = 0f64;
        (api!(RedisModule_ZsetScore)(self.key, m.ptr, &mut score) == api::OK).then_some(score)
    }

    /// `ZSCORE`.
    pub(super) unsafe fn score(&self, ctx: *mut RedisModuleCtx, member: &[u8]) -> Option<f64> {
        match self.changes.iter().find(|(m, _)| m == member) {
            Some((_, score)) => *score,
            None => self.stored_score(ctx, member),
        }
    }

    /// `ZADD` (a score) or `ZREM` (None).
    pub(super) fn set(&mut self, member: &[u8], score: Option<f64>) {
        match self.changes.iter_mut().find(|(m, _)| m == member) {
            Some(change) => change.1 = score,
            None => self.changes.push((member.to_vec(), score)),
        }
    }

    /// `ZADD`, answering whether the member is new (ZADD's reply, 1).
    pub(super) unsafe fn add(
        &mut self,
        ctx: *mut RedisModuleCtx,
        member: &[u8],
        score: f64,
    ) -> bool {
        let absent = self.score(ctx, member).is_none();
        self.set(member, Some(score));
        absent
    }

    /// `ZCARD`.
    pub(super) unsafe fn card(&self, ctx: *mut RedisModuleCtx) -> u64 {
        let mut n = if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY {
            0
        } else {
            api!(RedisModule_ValueLength)(self.key) as u64
        };
        for (member, score) in &self.changes {
            match (self.stored_score(ctx, member).is_some(), score.is_some()) {
                (false, true) => n += 1,
                (true, false) => n -= 1,
                _ => {}
            }
        }
        n
    }

    /// A sorted set with no changes yet.
    pub(super) fn new(key: *mut RedisModuleKey) -> Zset {
        Zset {
            key,
            changes: Vec::new(),
            heads: Vec::new(),
            all: false,
        }
    }

    /// The first member (lowest score, then lowest member), as `ZRANGE key 0 0` would answer
    /// after the changes.
    pub(super) unsafe fn first(&mut self, ctx: *mut RedisModuleCtx) -> Option<Vec<u8>> {
        let mut best: Option<(f64, Vec<u8>)> = None;
        loop {
            let unchanged = self
                .heads
                .iter()
                .find(|(_, member)| !self.changes.iter().any(|(m, _)| m == member));
            if let Some((score, member)) = unchanged {
                best = Some((*score, member.clone()));
                break;
            }
            if self.all {
                break;
            }
            self.read_heads(ctx, (self.heads.len() * 2).max(2));
        }
        for (member, score) in &self.changes {
            if let Some(score) = *score {
                let before = best
                    .as_ref()
                    .is_none_or(|(s, m)| score < *s || (score == *s && member < m));
                if before {
                    best = Some((score, member.clone()));
                }
            }
        }
        best.map(|(_, member)| member)
    }

    /// Read the first `n` members as stored (a window: a call that grants several waiters
    /// walks the set once, not once per waiter).
    unsafe fn read_heads(&mut self, ctx: *mut RedisModuleCtx, n: usize) {
        self.heads.clear();
        self.all = true;
        if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY
            || api!(RedisModule_ZsetFirstInScoreRange)(
                self.key,
                f64::NEG_INFINITY,
                f64::INFINITY,
                0,
                0,
            ) != api::OK
        {
            return;
        }
        while api!(RedisModule_ZsetRangeEndReached)(self.key) == 0 {
            if self.heads.len() == n {
                self.all = false;
                break;
            }
            let mut score = 0f64;
            let element = api!(RedisModule_ZsetRangeCurrentElement)(self.key, &mut score);
            self.heads.push((score, api::bytes(element).to_vec()));
            api::free(ctx, element);
            api!(RedisModule_ZsetRangeNext)(self.key);
        }
        api!(RedisModule_ZsetRangeStop)(self.key);
    }

    /// Write the changes; replicated as ZADD / ZREM.
    pub(super) unsafe fn write(
        &self,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        effects: &mut Effects,
    ) {
        let (mut added, mut removed) = (false, false);
        let adds = self.changes.iter().filter(|(_, s)| s.is_some()).count();
        if adds > 0 && key_type(self.key) != raw::REDISMODULE_KEYTYPE_EMPTY {
            let stored = api!(RedisModule_ValueLength)(self.key);
            encoding::crowded(ctx, self.key, stored + adds);
        }
        // The removals first: the insertions then walk a shorter set.
        let (gone, kept): (Vec<_>, Vec<_>) = self.changes.iter().partition(|(_, s)| s.is_none());
        for (member, score) in gone.into_iter().chain(kept) {
            let m = Str::new(ctx, member);
            match score {
                Some(score) => {
                    let mut flags = 0;
                    api!(RedisModule_ZsetAdd)(self.key, *score, m.ptr, &mut flags);
                    added = true;
                    if effects.replicating() {
                        let s = Str::new(ctx, &decimal_score(*score));
                        effects.replicate(c"ZADD", &[name, s.ptr, m.ptr]);
                    }
                }
                None => {
                    let mut deleted = 0;
                    if key_type(self.key) != raw::REDISMODULE_KEYTYPE_EMPTY {
                        api!(RedisModule_ZsetRem)(self.key, m.ptr, &mut deleted);
                    }
                    removed |= deleted != 0;
                    if deleted != 0 && effects.replicating() {
                        effects.replicate(c"ZREM", &[name, m.ptr]);
                    }
                }
            }
        }
        if added {
            effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zadd", name);
        }
        if removed {
            effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zrem", name);
        }
    }
}

/// A score as `%d` (every score written here is an integer).
pub(super) fn decimal_score(score: f64) -> Vec<u8> {
    if score < 0.0 {
        join(&[b"-", &decimal_text((-score) as u64)])
    } else {
        decimal_text(score as u64)
    }
}

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
    fn a_score_is_written_and_read_as_the_lua_writes_and_reads_it() {
        assert_eq!(decimal_score(1_500.0), b"1500");
        assert_eq!(decimal_score(0.0), b"0");
        assert_eq!(decimal_score(-1_500.0), b"-1500");
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
    fn a_sorted_set_keeps_one_change_per_member_the_last() {
        let mut z = Zset::new(std::ptr::null_mut());
        z.set(b"a", Some(1.0));
        z.set(b"b", Some(2.0));
        z.set(b"a", None);
        z.set(b"b", Some(3.0));
        assert_eq!(
            z.changes,
            vec![(b"a".to_vec(), None), (b"b".to_vec(), Some(3.0))]
        );
    }

    #[test]
    fn replies_are_built_as_given() {
        assert!(matches!(bulk(b"OK"), Reply::Bulk(b) if b == b"OK"));
        assert!(matches!(int(7), Reply::Int(7)));
    }
}
