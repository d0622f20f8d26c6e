//! Numbers and client-session records as the scripts read and write them (common.lua).
//!
//! A native path takes a call only when every text it reads is one the scripts would read to
//! the same number: plain decimal or hexadecimal digits, small enough to be exact in a Lua
//! number (at most 2^53). Anything else (a sign, an exponent, a fraction, too many digits)
//! answers None, and the call takes the reference path, which reads it as it always did.

/// The largest integer a Lua number holds exactly.
const EXACT: u64 = 1 << 53;

/// Plain decimal digits (as `tonumber` reads them), at most 2^53.
pub(crate) fn decimal(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    let mut n = 0u64;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(c - b'0');
    }
    (n <= EXACT).then_some(n)
}

/// Hexadecimal digits (as `tonumber(text, 16)` reads them), at most 2^53.
pub(crate) fn hex(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 14 {
        return None;
    }
    let mut n = 0u64;
    for &c in b {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        n = n << 4 | u64::from(d);
    }
    (n <= EXACT).then_some(n)
}

/// Text built on the stack: the hot paths allocate nothing. Longer than it holds (an id of
/// more than a couple of hundred bytes): None, and the call takes the reference path.
#[derive(Debug, Clone)]
pub(crate) struct Text {
    buf: [u8; 224],
    len: usize,
}

impl Text {
    pub(crate) fn new() -> Text {
        Text {
            buf: [0; 224],
            len: 0,
        }
    }

    /// The parts joined.
    pub(crate) fn of(parts: &[&[u8]]) -> Option<Text> {
        let mut t = Text::new();
        for part in parts {
            t.push(part)?;
        }
        Some(t)
    }

    pub(crate) fn push(&mut self, b: &[u8]) -> Option<&mut Text> {
        let end = self
            .len
            .checked_add(b.len())
            .filter(|&e| e <= self.buf.len())?;
        self.buf[self.len..end].copy_from_slice(b);
        self.len = end;
        Some(self)
    }

    /// `n` in decimal (`%d`).
    pub(crate) fn decimal(&mut self, n: u64) -> Option<&mut Text> {
        let mut b = [0u8; 20];
        self.push(fmt(&mut b, n))
    }

    /// `n` in lower-case hexadecimal (`%x`).
    pub(crate) fn hex(&mut self, n: u64) -> Option<&mut Text> {
        let mut b = [0u8; 16];
        let mut i = b.len();
        let mut n = n;
        loop {
            i -= 1;
            b[i] = b"0123456789abcdef"[(n & 15) as usize];
            n >>= 4;
            if n == 0 {
                break;
            }
        }
        self.push(&b[i..])
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// `n` in decimal, as `text()` / `%d` print it, into `buf`.
pub(crate) fn fmt(buf: &mut [u8; 20], n: u64) -> &[u8] {
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// What a native path answers where it declines: None, and the Lua serves the call.
pub(crate) type Native<T> = Option<T>;

/// `n` in decimal, as text of its own.
pub(crate) fn decimal_text(n: u64) -> Vec<u8> {
    let mut b = [0u8; 20];
    fmt(&mut b, n).to_vec()
}

/// The parts joined.
pub(crate) fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// How long a session record is kept after its renewal, and how long after it is renewed
/// again (common.lua: SESSION_MS, SESSION_RENEW_MS).
pub(crate) const SESSION_MS: u64 = 600_000;
pub(crate) const SESSION_RENEW_MS: u64 = 60_000;

/// A client session's record, "low|expiry|top|,seq=M,...", parsed as `session()` parses it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session<'a> {
    /// The highest low mark seen.
    pub(crate) low: u64,
    /// When the record goes (hexadecimal ms), as written.
    pub(crate) expiry: &'a [u8],
    /// The highest number marked.
    pub(crate) top: u64,
    /// The marks, ",seq=M..." (empty: none).
    pub(crate) marks: &'a [u8],
}

impl<'a> Session<'a> {
    /// The record `raw` (None: no record, as the scripts see a missing one). Answers None for
    /// a record the scripts would read otherwise than plainly (the reference path then).
    pub(crate) fn parse(raw: Option<&'a [u8]>) -> Option<Session<'a>> {
        let Some(raw) = raw else {
            return Some(Session {
                low: 0,
                expiry: b"0",
                top: 0,
                marks: b"",
            });
        };
        let mut parts = raw.splitn(4, |&c| c == b'|');
        let (low, expiry, top, marks) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let (low, _, top) = (hex(low)?, hex(expiry)?, hex(top)?);
        Some(Session {
            low,
            expiry,
            top,
            marks,
        })
    }

    /// `session_stale(seq)`: the call numbered `seq` (a number) is below the low mark.
    pub(crate) fn stale(&self, seq: u64) -> bool {
        seq < self.low
    }

    /// `session_mark(seq)`: whether the record marks the call numbered `seq` (its text, and
    /// the number it reads as).
    pub(crate) fn marked(&self, seq_text: &[u8], seq: u64) -> bool {
        if self.marks.is_empty() || seq > self.top {
            return false;
        }
        let needle_len = seq_text.len() + 2;
        self.marks
            .windows(needle_len)
            .any(|w| w[0] == b',' && &w[1..needle_len - 1] == seq_text && w[needle_len - 1] == b'=')
    }

    /// `session_put(low, seq, mark)` in its usual case: the record with the low mark raised to
    /// `low` and the call `seq_text` marked `mark`, when that needs no renewal of the record
    /// and every earlier mark is passed. None otherwise (the reference path writes it).
    pub(crate) fn put(&self, low: u64, seq_text: &[u8], mark: &[u8], now: u64) -> Option<Text> {
        let low = low.max(self.low);
        let expiry = hex(self.expiry)?;
        if expiry + SESSION_RENEW_MS <= now + SESSION_MS || self.top >= low {
            return None;
        }
        let mut value = Text::new();
        value
            .hex(low)?
            .push(b"|")?
            .push(self.expiry)?
            .push(b"|")?
            .push(seq_text)?
            .push(b"|,")?;
        value.push(seq_text)?.push(b"=")?.push(mark)?;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_taken_only_when_lua_reads_them_the_same() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"010"), Some(10));
        assert_eq!(decimal(b"9007199254740992"), Some(1 << 53));
        for odd in [
            &b""[..],
            b"-1",
            b"+1",
            b"1e3",
            b"1.0",
            b" 1",
            b"9007199254740993",
            b"12345678901234567",
        ] {
            assert_eq!(decimal(odd), None, "{}", String::from_utf8_lossy(odd));
        }
        assert_eq!(hex(b"fF"), Some(255));
        for odd in [&b""[..], b"g", b"0x1", b"-1", b"123456789abcdef"] {
            assert_eq!(hex(odd), None, "{}", String::from_utf8_lossy(odd));
        }
    }

    #[test]
    fn a_session_record_is_parsed_marked_and_put_as_the_scripts_do() {
        let s = Session::parse(Some(b"3|1f4|5|,4=R,5=G1")).unwrap();
        assert_eq!((s.low, s.expiry, s.top), (3, &b"1f4"[..], 5));
        assert!(s.stale(2) && !s.stale(3));
        assert!(s.marked(b"4", 4) && s.marked(b"5", 5));
        assert!(!s.marked(b"6", 6) && !s.marked(b"3", 3));
        // ",14=" is not ",4=".
        assert!(
            !Session::parse(Some(b"0|1f4|14|,14=R"))
                .unwrap()
                .marked(b"4", 4)
        );
        // A record that needs no renewal, its marks passed: the new text.
        let fresh = Session::parse(Some(b"3|100000|5|,5=R")).unwrap();
        let put = fresh.put(6, b"6", b"R", 0x100000 - SESSION_MS + SESSION_RENEW_MS - 1);
        assert_eq!(
            put.as_ref().map(Text::as_bytes),
            Some(&b"6|100000|6|,6=R"[..])
        );
        // Due for renewal, or a mark at or above the low mark kept: the reference path.
        assert!(
            fresh
                .put(6, b"6", b"R", 0x100000 - SESSION_MS + SESSION_RENEW_MS)
                .is_none()
        );
        assert!(fresh.put(5, b"6", b"R", 0).is_none());
        // Hexadecimal as %x writes it; too long for the stack: None.
        assert_eq!(
            Text::new().hex(0xab0).unwrap().hex(0).unwrap().as_bytes(),
            b"ab00"
        );
        assert!(Text::of(&[&[b'x'; 200], &[b'y'; 100]]).is_none());
        // No record: it would be made (a renewal).
        assert!(
            Session::parse(None)
                .unwrap()
                .put(1, b"1", b"R", 0)
                .is_none()
        );
        assert!(Session::parse(Some(b"x|1|1|")).is_none());
    }
}
