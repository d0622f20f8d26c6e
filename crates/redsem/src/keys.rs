//! Every Redis key and channel name redsem uses is built here, and only here.
//!
//! Keys read `<prefix>:{<kind>:<name>}:<part>`: all keys of one primitive share the text up to
//! the closing brace, so they hash to one cluster slot whatever the name contains.

/// The keys of one lease semaphore, in the order the `lua/lease/` scripts expect them.
#[derive(Debug, Clone)]
pub(crate) struct LeaseKeys {
    pub(crate) all: [String; Self::COUNT],
}

impl LeaseKeys {
    /// How many keys its operations take.
    pub(crate) const COUNT: usize = 6;

    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}:{{lease:{name}}}");
        let part = |p: &str| format!("{base}:{p}");
        LeaseKeys {
            all: [
                part("leases"),
                part("queue"),
                part("state"),
                part("slots"),
                part("tenants"),
                part("tqueue"),
            ],
        }
    }
}

/// Why `prefix` cannot start redsem's keys, if it cannot.
///
/// Every key is `<prefix>:{<kind>:<name>}:<part>` and Redis Cluster hashes the text between
/// the *first* `{` and the next `}`: a brace in the prefix would move the hash tag into the
/// prefix, so a primitive's keys would no longer share one slot and every script would fail
/// on a cluster with CROSSSLOT (and on a single server, keys made here would not move to a
/// cluster later). Rejected everywhere, so a prefix works the same on both.
pub(crate) fn prefix_problem(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return Some("the key prefix must not be empty".to_owned());
    }
    if prefix.contains(['{', '}']) {
        return Some(format!(
            "the key prefix {prefix:?} contains a brace: redsem puts each primitive's name in \
             {{...}} after the prefix so all its keys share one Redis Cluster hash slot, and a \
             brace in the prefix would take that place (every call on a cluster would fail \
             with CROSSSLOT); use a prefix without {{ and }}"
        ));
    }
    None
}

/// `text` with the glob characters of `SCAN MATCH` and ACL patterns escaped.
pub(crate) fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// A `SCAN MATCH` pattern for the `state` key of every lease semaphore under `prefix`.
pub(crate) fn lease_state_pattern(prefix: &str) -> String {
    format!("{}:{{lease:*}}:state", escape_glob(prefix))
}

/// A `SCAN MATCH` pattern for every key of every primitive of `kind` (`permits`, `latch`)
/// under `prefix`.
pub(crate) fn kind_pattern(prefix: &str, kind: &str) -> String {
    format!("{}:{{{kind}:*}}:*", escape_glob(prefix))
}

/// The name in a key of a primitive of `kind` found by [`kind_pattern`], if the key is one of
/// `parts` (the keys that exist while it has state).
pub(crate) fn name_of_key(prefix: &str, kind: &str, parts: &[&str], key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let rest = rest.strip_prefix(kind)?.strip_prefix(':')?;
    parts
        .iter()
        .find_map(|part| rest.strip_suffix(&format!("}}:{part}")).map(str::to_owned))
}

/// A key under `prefix` that the connect-time ACL probe names (never written); `n` picks its
/// hash tag, so that a key can be found for any cluster node.
pub(crate) fn acl_probe_key(prefix: &str, n: u32) -> String {
    format!("{prefix}:{{check:{n}}}:acl")
}

/// The semaphore name in a `state` key found by [`lease_state_pattern`].
pub(crate) fn lease_name_of_state(prefix: &str, key: &str) -> Option<String> {
    key.strip_prefix(prefix)?
        .strip_prefix(":{lease:")?
        .strip_suffix("}:state")
        .map(str::to_owned)
}

/// The channel on which one `Redsem` client is told that one of its queued requests was granted
/// (classic pub/sub: one server, or a primary behind Sentinels).
pub(crate) fn wake_channel(prefix: &str, client_id: &str) -> String {
    format!("{prefix}:wake:{client_id}")
}

/// The channel on which one `Redsem` client connected to a Redis Cluster is told that one of
/// its queued requests on the primitive `{<kind>:<name>}` was granted: its classic channel
/// ([`wake_channel`]) and the primitive's hash tag, `<prefix>:wake:<client>:{<kind>:<name>}`,
/// sharded pub/sub in that primitive's slot.
///
/// It ends with the primitive's hash tag, which is what marks it sharded ([`is_sharded`]),
/// and it hashes to the slot of the primitive's keys: its first `{` is the one before
/// `<kind>` (the prefix and the client id have none) and what follows it up to the first `}`
/// is the same text as in the keys.
pub(crate) fn shard_wake_channel(wake_channel: &str, kind: &str, name: &str) -> String {
    format!("{wake_channel}:{{{kind}:{name}}}")
}

/// The channel on which the waiters of a latch on a Redis Cluster hear that it opened:
/// `<prefix>:opened:{latch:<name>}`, sharded pub/sub in the latch's slot (see
/// [`shard_wake_channel`]; the classic one is [`LatchKeys::channel`]).
pub(crate) fn shard_latch_channel(prefix: &str, name: &str) -> String {
    format!("{prefix}:opened:{{latch:{name}}}")
}

/// Whether wake-ups on `channel` go by sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`) rather than
/// classic (`PUBLISH`, `SUBSCRIBE`): exactly when its last byte is `}`.
///
/// The one rule, shared by the scripts (`lua/common.lua`, `save()`), the native engine and
/// this crate; docs/DESIGN.md states it. Classic channels never end with `}`: they end with a
/// client id (hexadecimal) or `:opened`. Sharded ones end with their primitive's hash tag
/// ([`shard_wake_channel`], [`shard_latch_channel`]).
pub(crate) fn is_sharded(channel: &str) -> bool {
    channel.as_bytes().last() == Some(&b'}')
}

/// The keys of one permit semaphore, in the order the `lua/permit/` scripts expect them.
#[derive(Debug, Clone)]
pub(crate) struct PermitKeys {
    pub(crate) all: [String; Self::COUNT],
}

impl PermitKeys {
    /// How many keys its operations take.
    pub(crate) const COUNT: usize = 6;

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

/// The keys of one countdown latch, in the order the `lua/latch/` scripts expect them, and
/// the channel on which its waiters hear that it opened.
#[derive(Debug, Clone)]
pub(crate) struct LatchKeys {
    pub(crate) all: [String; Self::COUNT],
    pub(crate) channel: String,
}

impl LatchKeys {
    /// How many keys its operations take.
    pub(crate) const COUNT: usize = 4;

    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}:{{latch:{name}}}");
        let part = |p: &str| format!("{base}:{p}");
        LatchKeys {
            all: [
                part("count"),
                part("done"),
                part("applied"),
                part("sessions"),
            ],
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
        assert_eq!(
            name_of_key(
                "p",
                "latch",
                &["count", "done"],
                &LatchKeys::new("p", "a}b").all[1]
            ),
            Some("a}b".to_owned())
        );
        assert_eq!(
            name_of_key("p", "latch", &["count"], "p:{latch:x}:applied"),
            None
        );
        assert_eq!(kind_pattern("a*", "permits"), "a\\*:{permits:*}:*");
    }

    #[test]
    fn prefixes_with_braces_are_refused_and_others_accepted() {
        for bad in ["", "{app}", "a{b", "a}b"] {
            assert!(prefix_problem(bad).is_some(), "{bad:?}");
        }
        for good in ["redsem", "app:locks", "a*b", "with space", "ü"] {
            assert_eq!(prefix_problem(good), None, "{good:?}");
        }
        let why = prefix_problem("x{1}").unwrap_or_default();
        assert!(why.contains("brace") && why.contains("CROSSSLOT"), "{why}");
    }

    #[test]
    fn sharded_channels_end_with_the_hash_tag_of_their_primitive() {
        for name in ["jobs", "a}b", "{x}", "", "weird:{name", "x{y", "}"] {
            let lease = LeaseKeys::new("redsem", name);
            let permits = PermitKeys::new("redsem", name);
            let latch = LatchKeys::new("redsem", name);
            let wake = shard_wake_channel(&wake_channel("redsem", "0af3"), "lease", name);
            let permit_wake = shard_wake_channel(&wake_channel("redsem", "0af3"), "permits", name);
            let opened = shard_latch_channel("redsem", name);
            assert_eq!(hash_tag(&wake), hash_tag(&lease.all[0]), "{wake}");
            assert_eq!(
                hash_tag(&permit_wake),
                hash_tag(&permits.all[0]),
                "{permit_wake}"
            );
            assert_eq!(hash_tag(&opened), hash_tag(&latch.all[0]), "{opened}");
            for channel in [&wake, &permit_wake, &opened] {
                assert!(is_sharded(channel), "{channel}");
                assert!(
                    channel.starts_with("redsem:"),
                    "{channel}: under the prefix (ACL)"
                );
            }
            // The classic ones are not, whatever the name.
            assert!(!is_sharded(&latch.channel), "{}", latch.channel);
        }
        assert!(!is_sharded(&wake_channel("redsem", "0af3")));
        assert_eq!(
            shard_wake_channel(&wake_channel("p", "c1"), "lease", "jobs"),
            "p:wake:c1:{lease:jobs}"
        );
        assert_eq!(shard_latch_channel("p", "boot"), "p:opened:{latch:boot}");
    }

    #[test]
    fn keys_are_readable() {
        let keys = LeaseKeys::new("p", "build");
        assert_eq!(keys.all[0], "p:{lease:build}:leases");
        assert_eq!(keys.all[3], "p:{lease:build}:slots");
    }
}
