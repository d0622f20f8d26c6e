//! Small value types shared by the primitives.

use std::fmt;

/// A fencing token: a number that strictly increases with every grant of one semaphore,
/// over its whole life (also after it went idle and its other keys expired).
///
/// Pass it to the resource you protect and have the resource reject any token lower than
/// the highest it has seen: a holder that lost its lease (a long pause, a partition) then
/// cannot overwrite the work of the holder that came after it.
///
/// Tokens are exact up to 2<sup>53</sup> (Redis scripts count in doubles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The id of a permit or of a queued request: 128 random bits as 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PermitId(String);

impl PermitId {
    /// A fresh random id.
    pub(crate) fn random() -> Self {
        PermitId(format!("{:032x}", rand::random::<u128>()))
    }

    /// Wrap an id that came from elsewhere (a CLI argument, a status listing).
    pub fn new(id: impl Into<String>) -> Self {
        PermitId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_32_hex_digits_and_differ() {
        let a = PermitId::random();
        let b = PermitId::random();
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
