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

impl SessionRecord {
    /// `session()`: None for a record the Lua would read otherwise than plainly.
    pub(crate) fn parse(name: Vec<u8>, raw: Option<Vec<u8>>) -> Native<SessionRecord> {
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
