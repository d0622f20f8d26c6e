//! Every Redis key and channel name redsem uses is built here, and only here.
//!
//! Keys read `<prefix>:{<kind>:<name>}:<part>`: all keys of one primitive share the text up to
//! the closing brace, so they hash to one cluster slot whatever the name contains.

/// The keys of one lease semaphore, in the order the `lease_*.lua` scripts expect them.
#[derive(Debug, Clone)]
pub(crate) struct LeaseKeys {
    pub(crate) all: [String; 5],
}

impl LeaseKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}:{{lease:{name}}}");
        let part = |p: &str| format!("{base}:{p}");
        LeaseKeys {
            all: [
                part("leases"),
                part("queue"),
                part("state"),
                part("slots"),
                part("token"),
            ],
        }
    }
}

/// A `SCAN MATCH` pattern for the `state` key of every lease semaphore under `prefix`.
pub(crate) fn lease_state_pattern(prefix: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    format!("{escaped}:{{lease:*}}:state")
}

/// The semaphore name in a `state` key found by [`lease_state_pattern`].
pub(crate) fn lease_name_of_state(prefix: &str, key: &str) -> Option<String> {
    key.strip_prefix(prefix)?
        .strip_prefix(":{lease:")?
        .strip_suffix("}:state")
        .map(str::to_owned)
}

/// The channel on which one `Redsem` client is told that one of its queued requests was granted.
pub(crate) fn wake_channel(prefix: &str, client_id: &str) -> String {
    format!("{prefix}:wake:{client_id}")
}

/// The keys of one permit semaphore, in the order the `permit_*.lua` scripts expect them.
#[derive(Debug, Clone)]
pub(crate) struct PermitKeys {
    pub(crate) all: [String; 6],
}

impl PermitKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}:{{permits:{name}}}");
        let part = |p: &str| format!("{base}:{p}");
        PermitKeys {
            all: [
                part("count"),
                part("queue"),
                part("waiters"),
                part("records"),
                part("meta"),
                part("applied"),
            ],
        }
    }
}

/// The keys of one countdown latch, in the order the `latch_*.lua` scripts expect them, and
/// the channel on which its waiters hear that it opened.
#[derive(Debug, Clone)]
pub(crate) struct LatchKeys {
    pub(crate) all: [String; 3],
    pub(crate) channel: String,
}

impl LatchKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}:{{latch:{name}}}");
        let part = |p: &str| format!("{base}:{p}");
        LatchKeys {
            all: [part("count"), part("done"), part("applied")],
            channel: part("opened"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The part of a key Redis Cluster hashes: the first `{...}` with something inside.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{')
            && let Some(len) = key[open + 1..].find('}')
            && len > 0
        {
            return &key[open + 1..open + 1 + len];
        }
        key
    }

    #[test]
    fn all_keys_share_one_hash_tag_and_the_prefix() {
        for name in ["jobs", "a}b", "{x}", "", "weird:{name"] {
            let keys = LeaseKeys::new("redsem", name);
            let tag = hash_tag(&keys.all[0]);
            for key in &keys.all {
                assert!(key.starts_with("redsem:{lease:"), "{key}");
                assert_eq!(hash_tag(key), tag, "{key} of {name:?}");
            }
        }
    }

    #[test]
    fn permit_and_latch_keys_share_one_hash_tag_each() {
        for name in ["jobs", "a}b", "{x}", "", "weird:{name"] {
            let permits = PermitKeys::new("redsem", name);
            let latch = LatchKeys::new("redsem", name);
            for (kind, keys) in [("permits", &permits.all[..]), ("latch", &latch.all[..])] {
                let tag = hash_tag(&keys[0]);
                assert_eq!(
                    tag,
                    format!("{kind}:{name}").split('}').next().unwrap_or("")
                );
                for key in keys {
                    assert!(key.starts_with(&format!("redsem:{{{kind}:")), "{key}");
                    assert_eq!(hash_tag(key), tag, "{key} of {name:?}");
                }
            }
            assert!(latch.channel.starts_with("redsem:{latch:"));
        }
        assert_eq!(PermitKeys::new("p", "db").all[0], "p:{permits:db}:count");
        assert_eq!(PermitKeys::new("p", "db").all[5], "p:{permits:db}:applied");
        let latch = LatchKeys::new("p", "boot");
        assert_eq!(latch.all[0], "p:{latch:boot}:count");
        assert_eq!(latch.all[1], "p:{latch:boot}:done");
        assert_eq!(latch.channel, "p:{latch:boot}:opened");
    }

    #[test]
    fn scan_pattern_escapes_the_prefix_and_names_round_trip() {
        assert_eq!(lease_state_pattern("a*b"), "a\\*b:{lease:*}:state");
        for name in ["jobs", "a}b", "x:{y}"] {
            let keys = LeaseKeys::new("p", name);
            assert_eq!(
                lease_name_of_state("p", &keys.all[2]).as_deref(),
                Some(name)
            );
        }
        assert_eq!(lease_name_of_state("p", "q:{lease:x}:state"), None);
    }

    #[test]
    fn keys_are_readable() {
        let keys = LeaseKeys::new("p", "build");
        assert_eq!(keys.all[0], "p:{lease:build}:leases");
        assert_eq!(keys.all[4], "p:{lease:build}:token");
    }
}
