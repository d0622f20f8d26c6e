//! The caller's client-session record over one whole call, as common.lua's session functions
//! keep it (session(), session_stale(), session_mark(), session_put(), session_text()): the
//! general native paths, which may mark several calls of a batch and renew the record.
//! (record.rs has the fast paths' one-mark case.)

use crate::record::{Native, SESSION_MS, SESSION_RENEW_MS, Text, hex, join};

/// The caller's session record as common.lua's session functions keep it during a call.
#[derive(Debug)]
pub(crate) struct SessionRecord {
    /// The field, `s:<session>`.
    pub(crate) name: Vec<u8>,
    /// The record's text as it stands (S[S.sess]).
    pub(crate) raw: Option<Vec<u8>>,
    /// Low mark, expiry (hex text), highest number marked, where the marks start (0: none;
    /// 1-based as in Lua).
    pub(crate) sl: u64,
    pub(crate) sx: Vec<u8>,
    pub(crate) sm: u64,
    pub(crate) sp: usize,
    /// The marks once more than one is kept (S.smarks, in S.sorder's order).
    pub(crate) marks: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    pub(crate) dirty: bool,
}

/// The longest record the general native paths take (about 650 marks of calls in flight).
/// Their marks are kept in a list searched by number, rebuilt on every call: fine for the
/// calls a client has in flight, slower than the Lua's table for thousands (a client that
/// never raises its low mark); those calls run the Lua.
pub(crate) const LONGEST_RECORD: usize = 8192;

impl SessionRecord {
    /// `session()`: None for a record the Lua would read otherwise than plainly, or one
    /// longer than [`LONGEST_RECORD`].
    pub(crate) fn parse(name: Vec<u8>, raw: Option<Vec<u8>>) -> Native<SessionRecord> {
        if raw.as_ref().is_some_and(|r| r.len() > LONGEST_RECORD) {
            return None;
        }
        let mut s = SessionRecord {
            name,
            raw,
            sl: 0,
            sx: b"0".to_vec(),
            sm: 0,
            sp: 0,
            marks: None,
            dirty: false,
        };
        if let Some(raw) = &s.raw {
            let mut parts = raw.splitn(4, |&c| c == b'|');
            let (low, expiry, top, rest) =
                (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            let (low, _, top) = (hex(low)?, hex(expiry)?, hex(top)?);
            s.sl = low;
            s.sx = expiry.to_vec();
            s.sm = top;
            s.sp = raw.len() - rest.len() + 1;
        }
        Some(s)
    }

    /// The marks of the record's text from `sp` on, ",seq=mark" each (None: not plainly so).
    pub(crate) fn marks_of(text: &[u8]) -> Native<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut marks: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if text.is_empty() {
            return Some(marks);
        }
        if text[0] != b',' {
            return None;
        }
        for item in text[1..].split(|&c| c == b',') {
            let at = item.iter().position(|&c| c == b'=')?;
            let (seq, mark) = (&item[..at], &item[at + 1..]);
            hex(seq)?;
            if mark.is_empty() || mark.contains(&b'=') {
                return None;
            }
            match marks.iter_mut().find(|(s, _)| s == seq) {
                Some(m) => m.1 = mark.to_vec(),
                None => marks.push((seq.to_vec(), mark.to_vec())),
            }
        }
        Some(marks)
    }

    /// `session_stale(seq)`.
    pub(crate) fn stale(&self, seq: u64) -> bool {
        seq < self.sl
    }

    /// `session_mark(seq)`: the mark of the call `seq_text` (None: declined; Some(None):
    /// unmarked).
    pub(crate) fn mark(&self, seq_text: &[u8], seq: u64) -> Native<Option<Vec<u8>>> {
        if let Some(marks) = &self.marks {
            return Some(
                marks
                    .iter()
                    .find(|(s, _)| s == seq_text)
                    .map(|(_, m)| m.clone()),
            );
        }
        if self.sp == 0 || seq > self.sm {
            return Some(None);
        }
        let raw = self.raw.as_ref()?;
        let needle = join(&[b",", seq_text, b"="]);
        let from = self.sp - 1;
        let at = raw[from..].windows(needle.len()).position(|w| w == needle);
        Some(at.and_then(|at| {
            let rest = &raw[from + at + needle.len()..];
            let end = rest.iter().position(|&c| c == b',').unwrap_or(rest.len());
            (end > 0).then(|| rest[..end].to_vec())
        }))
    }

    /// `session_put(low, seq, mark)`: answers the renewed expiry, if the record was renewed.
    pub(crate) fn put(
        &mut self,
        low: u64,
        seq_text: &[u8],
        mark: &[u8],
        now: u64,
    ) -> Native<Option<u64>> {
        let seq = hex(seq_text)?;
        let low = low.max(self.sl);
        let mut renewed = None;
        if hex(&self.sx)? + SESSION_RENEW_MS <= now + SESSION_MS {
            let at = now + SESSION_MS;
            renewed = Some(at);
            self.sx = Text::new().hex(at)?.as_bytes().to_vec();
        }
        self.sl = low;
        self.dirty = true;
        if self.marks.is_none() && self.sm < low {
            let value = join(&[
                Text::new().hex(low)?.as_bytes(),
                b"|",
                &self.sx,
                b"|",
                seq_text,
                b"|,",
                seq_text,
                b"=",
                mark,
            ]);
            self.sp = value.len() - seq_text.len() - mark.len() - 1;
            self.sm = seq;
            self.raw = Some(value);
            return Some(renewed);
        }
        if self.marks.is_none() {
            // (No record: the Lua fails here, on string.sub of nothing.)
            let raw = self.raw.as_ref()?;
            self.marks = Some(SessionRecord::marks_of(&raw[self.sp.checked_sub(1)?..])?);
        }
        let marks = self.marks.as_mut()?;
        match marks.iter_mut().find(|(s, _)| s == seq_text) {
            Some(m) => m.1 = mark.to_vec(),
            None => marks.push((seq_text.to_vec(), mark.to_vec())),
        }
        Some(renewed)
    }

    /// The record to write back: `session_text()` when marks are kept in a table.
    pub(crate) fn text(&self) -> Native<Option<Vec<u8>>> {
        let Some(marks) = &self.marks else {
            return Some(self.raw.clone());
        };
        let (mut kept, mut top) = (Vec::new(), 0);
        for (seq, mark) in marks {
            let number = hex(seq).unwrap_or(0);
            if number >= self.sl {
                kept.extend_from_slice(&join(&[b",", seq, b"=", mark]));
                top = top.max(number);
            }
        }
        let mut t = Vec::new();
        t.extend_from_slice(Text::new().hex(self.sl)?.as_bytes());
        t.push(b'|');
        t.extend_from_slice(&self.sx);
        t.push(b'|');
        t.extend_from_slice(Text::new().hex(top)?.as_bytes());
        t.push(b'|');
        t.extend_from_slice(&kept);
        Some(Some(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(raw: &[u8]) -> SessionRecord {
        SessionRecord::parse(b"s:x".to_vec(), Some(raw.to_vec())).expect("a plain record")
    }

    /// A time at which a record expiring at 0x100000 needs no renewal yet (one ms later it
    /// does).
    const FRESH: u64 = 0x100000 - SESSION_MS + SESSION_RENEW_MS - 1;

    #[test]
    fn a_record_longer_than_the_longest_is_declined() {
        let mark = b",1=R";
        let mut raw = b"1|100000|1|".to_vec();
        while raw.len() + mark.len() <= LONGEST_RECORD {
            raw.extend_from_slice(mark);
        }
        assert!(SessionRecord::parse(b"s:x".to_vec(), Some(raw.clone())).is_some());
        raw.extend_from_slice(mark);
        assert!(SessionRecord::parse(b"s:x".to_vec(), Some(raw)).is_none());
    }

    #[test]
    fn a_record_is_parsed_as_session_reads_it() {
        let none = SessionRecord::parse(b"s:x".to_vec(), None).unwrap();
        assert_eq!(
            (none.sl, &none.sx[..], none.sm, none.sp),
            (0, &b"0"[..], 0, 0)
        );
        assert!(none.marks.is_none() && !none.dirty);
        let s = record(b"3|1f4|5|,4=R,5=G1");
        assert_eq!((s.sl, &s.sx[..], s.sm, s.sp), (3, &b"1f4"[..], 5, 9));
        let bare = record(b"a|1f4|b|");
        assert_eq!((bare.sl, bare.sm, bare.sp), (10, 11, 9));
        for odd in [&b"x|1|1|"[..], b"1|x|1|", b"1|1|x|", b"1|1|1", b"1|1"] {
            assert!(
                SessionRecord::parse(Vec::new(), Some(odd.to_vec())).is_none(),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }
    }

    #[test]
    fn marks_are_read_in_order_the_last_of_a_number_winning() {
        let marks = |t: &[u8]| SessionRecord::marks_of(t);
        assert_eq!(marks(b""), Some(Vec::new()));
        assert_eq!(
            marks(b",4=R,5=G1,4=D"),
            Some(vec![
                (b"4".to_vec(), b"D".to_vec()),
                (b"5".to_vec(), b"G1".to_vec())
            ])
        );
        for odd in [&b"4=R"[..], b",4", b",4=", b",x=R", b",4=R=D", b",4=R,"] {
            assert_eq!(marks(odd), None, "{}", String::from_utf8_lossy(odd));
        }
    }

    #[test]
    fn a_call_is_stale_below_the_low_mark_and_its_mark_found_by_its_number() {
        let s = record(b"3|1f4|14|,4=R,5=G1,14=D");
        assert!(s.stale(2) && !s.stale(3) && !s.stale(4));
        let mark = |seq: &[u8]| {
            s.mark(
                seq,
                u64::from_str_radix(std::str::from_utf8(seq).unwrap(), 16).unwrap(),
            )
        };
        assert_eq!(mark(b"4"), Some(Some(b"R".to_vec())));
        assert_eq!(mark(b"5"), Some(Some(b"G1".to_vec())));
        assert_eq!(mark(b"14"), Some(Some(b"D".to_vec())));
        assert_eq!(mark(b"6"), Some(None));
        assert_eq!(mark(b"15"), Some(None));
        // ",4=" is not ",14=", and a number above the highest marked has no mark.
        let s = record(b"0|1f4|14|,14=R");
        assert_eq!(s.mark(b"4", 4), Some(None));
        assert_eq!(s.mark(b"14", 0x14), Some(Some(b"R".to_vec())));
        let s = record(b"0|1f4|3|,14=R");
        assert_eq!(s.mark(b"14", 0x14), Some(None));
        // No marks at all; an empty mark.
        assert_eq!(record(b"0|1f4|0|").mark(b"0", 0), Some(None));
        assert_eq!(record(b"0|1f4|5|,4=,5=R").mark(b"4", 4), Some(None));
        // Marks kept in a table: looked up there.
        let mut s = record(b"3|100000|5|,5=R");
        s.put(3, b"6", b"D", FRESH).unwrap();
        assert_eq!(s.mark(b"6", 6), Some(Some(b"D".to_vec())));
        assert_eq!(s.mark(b"5", 5), Some(Some(b"R".to_vec())));
        assert_eq!(s.mark(b"7", 7), Some(None));
    }

    #[test]
    fn a_put_past_every_mark_writes_the_record_with_one_mark() {
        let mut s = record(b"3|100000|5|,5=R");
        assert_eq!(s.put(6, b"6", b"R", FRESH), Some(None));
        assert_eq!(s.raw.as_deref(), Some(&b"6|100000|6|,6=R"[..]));
        assert_eq!((s.sl, s.sm, s.sp, s.dirty), (6, 6, 12, true));
        assert!(s.marks.is_none());
        assert_eq!(s.text(), Some(Some(b"6|100000|6|,6=R".to_vec())));
        assert_eq!(s.mark(b"6", 6), Some(Some(b"R".to_vec())));
        // A low mark lower than the record's: the record's stands.
        let mut s = record(b"3|100000|2|,2=R");
        assert_eq!(s.put(1, b"a", b"D", FRESH), Some(None));
        assert_eq!(s.raw.as_deref(), Some(&b"3|100000|a|,a=D"[..]));
        // No record: made, and renewed.
        let mut s = SessionRecord::parse(b"s:x".to_vec(), None).unwrap();
        assert_eq!(s.put(1, b"1", b"R", 5), Some(Some(5 + SESSION_MS)));
        assert_eq!(s.raw.as_deref(), Some(&b"1|927c5|1|,1=R"[..]));
    }

    #[test]
    fn a_record_is_renewed_once_renewed_long_enough_ago() {
        let mut s = record(b"3|100000|5|,5=R");
        let now = FRESH + 1;
        assert_eq!(s.put(6, b"6", b"R", now), Some(Some(now + SESSION_MS)));
        let sx = format!("{:x}", now + SESSION_MS);
        assert_eq!(s.sx, sx.as_bytes());
        assert_eq!(s.raw, Some(format!("6|{sx}|6|,6=R").into_bytes()));
    }

    #[test]
    fn marks_in_flight_are_kept_in_a_table_and_written_above_the_low_mark() {
        let mut s = record(b"3|100000|5|,4=R,5=G1");
        assert_eq!(s.put(4, b"6", b"X", FRESH), Some(None));
        assert_eq!(s.put(4, b"5", b"D", FRESH), Some(None));
        assert_eq!(s.sl, 4);
        assert_eq!(s.text(), Some(Some(b"4|100000|6|,4=R,5=D,6=X".to_vec())));
        // The low mark passes 4 and 5: their marks go, the top is the highest kept.
        assert_eq!(s.put(6, b"c", b"R", FRESH), Some(None));
        assert_eq!(s.text(), Some(Some(b"6|100000|c|,6=X,c=R".to_vec())));
        // Every mark passed: the top is 0.
        let mut s = record(b"3|100000|5|,5=R");
        s.put(3, b"4", b"R", FRESH).unwrap();
        s.sl = 6;
        assert_eq!(s.text(), Some(Some(b"6|100000|0|".to_vec())));
        // A record with nothing to keep marks from: declined, as the Lua fails.
        let mut s = SessionRecord::parse(b"s:x".to_vec(), None).unwrap();
        assert_eq!(s.put(0, b"0", b"R", 5), None);
        // A number or an expiry that is no hexadecimal: declined.
        assert_eq!(record(b"3|100000|5|").put(6, b"g", b"R", FRESH), None);
    }
}
