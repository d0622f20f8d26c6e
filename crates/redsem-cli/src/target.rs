//! What `--url` names: one server, a Redis Cluster through its seed nodes, or the primary that
//! a set of Sentinels watches.
//!
//! ```text
//! redis://[user:password@]host[:port][/db]                       one server (rediss:// for TLS)
//! redis+cluster://[user:password@]host:port[,host:port...]       a cluster, by its seed nodes
//! redis+sentinel://[user:password@]host[:port][,...]/master[/db] the primary that Sentinels watch
//! ```
//!
//! The library reads these forms ([`redsem::ConnectTarget::parse`], as `Redsem::connect` does);
//! this module makes its errors usage errors of `--url`.

use crate::error::{CliError, exit};

pub(crate) use redsem::{ConnectTarget as Target, TargetHosts as Nodes};

/// Read `url`; a malformed cluster or sentinel URL is a usage error (exit 2) that says which
/// part is wrong (without the password). Plain URLs are left to the `redis` crate.
pub(crate) fn parse(url: &str) -> Result<Target, CliError> {
    let target = Target::parse(url).map_err(|err| match err {
        redsem::Error::InvalidArgument(why) => {
            CliError::new(exit::USAGE, why.replacen("bad url ", "bad --url ", 1))
        }
        other => CliError::new(exit::USAGE, other.to_string()),
    })?;
    if target == Target::Server && redsem::redis::Client::open(url).is_err() {
        return Err(not_a_url(url));
    }
    Ok(target)
}

/// The forms `--url` takes, said when it is none of them.
const FORMS: &str = "redis://[user:password@]host[:port][/db], rediss://... (TLS), \
                     redis+cluster://host:port[,host:port...], \
                     redis+sentinel://host[:port][,host[:port]...]/MASTER[/db] (rediss+ for \
                     TLS) or unix:///path/to/redis.sock";

/// A usage error for a `--url` the `redis` crate cannot read: which scheme is wrong, and the
/// forms that work.
fn not_a_url(url: &str) -> CliError {
    let shown = redacted(url);
    let what = match url.split_once("://") {
        Some((scheme, _)) if !KNOWN_SCHEMES.contains(&scheme) => {
            format!("--url {shown}: unknown scheme {scheme:?}")
        }
        Some(_) => match bad_port(url) {
            Some(port) => {
                return CliError::new(
                    exit::USAGE,
                    format!("--url {shown}: the port {port:?} is not a number from 1 to 65535"),
                );
            }
            None => format!("--url {shown} is not a URL redsem can read"),
        },
        None => format!("--url {shown} has no scheme"),
    };
    CliError::new(exit::USAGE, format!("{what}; write {FORMS}"))
}

/// The port of a one-server `url` (`scheme://[user:password@]host:port[/...]`) when it is not
/// one: not a number, or not in 1..=65535; `None` when it is one, or there is none.
fn bad_port(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let port = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.1.strip_prefix(':')?,
        None => host_port.rsplit_once(':')?.1,
    };
    match port.parse::<u16>() {
        Ok(number) if number != 0 => None,
        _ => Some(port.to_owned()),
    }
}

/// The schemes of one server that the `redis` crate reads.
const KNOWN_SCHEMES: [&str; 7] = [
    "redis",
    "rediss",
    "unix",
    "redis+unix",
    "valkey",
    "valkeys",
    "valkey+unix",
];

/// Whether the data nodes behind `url` (read as `target`) are reached over TLS.
pub(crate) fn is_tls(target: &Target, url: &str) -> bool {
    match target {
        Target::Cluster(nodes)
        | Target::Sentinel {
            sentinels: nodes, ..
        } => nodes.is_tls(),
        _ => url.starts_with("rediss://"),
    }
}

/// A form of URL this version of the CLI does not know how to check (a newer library's).
pub(crate) fn unsupported(url: &str) -> CliError {
    CliError::new(
        exit::USAGE,
        format!("--url {}: this form is not supported here", redacted(url)),
    )
}

/// `url` without its password, for messages.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_are_left_to_the_redis_crate() {
        for url in ["redis://h:1/2", "rediss://u:p@h", "unix:///tmp/r.sock"] {
            assert_eq!(parse(url).unwrap(), Target::Server);
        }
        for url in ["h:6379", "foo://h", "redis+clutser://h:1"] {
            let err = parse(url).unwrap_err();
            assert_eq!(err.code(), exit::USAGE);
            assert!(err.to_string().contains("rediss://"), "{err}");
        }
        let err = parse("foo://u:secret@h").unwrap_err().to_string();
        assert!(err.contains("unknown scheme \"foo\""), "{err}");
        assert!(!err.contains("secret"), "{err}");
        assert!(is_tls(&Target::Server, "rediss://u:p@h"));
        assert!(!is_tls(&Target::Server, "redis://h"));
    }

    #[test]
    fn cluster_urls_list_their_seeds() {
        let target = parse("redis+cluster://app:pw@a:7000,b,[::1]:7002").unwrap();
        let Target::Cluster(nodes) = &target else {
            panic!("{target:?}")
        };
        assert_eq!(
            nodes.addresses(),
            [
                ("a".to_owned(), 7000),
                ("b".to_owned(), 6379),
                ("::1".to_owned(), 7002)
            ]
        );
        assert_eq!(nodes.node_url("b", 6379, None), "redis://app:pw@b:6379");
        let tls = parse("rediss+cluster://a:7000/").unwrap();
        assert!(is_tls(&tls, "rediss+cluster://a:7000/"));
    }

    /// The hosts, master name and database of a sentinel URL.
    fn sentinel(url: &str) -> (Nodes, String, Option<u32>) {
        match parse(url).unwrap() {
            Target::Sentinel {
                sentinels,
                master,
                db,
                ..
            } => (sentinels, master, db),
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn sentinel_urls_name_the_master_and_maybe_a_database() {
        let (nodes, master, db) = sentinel("redis+sentinel://s1,s2:26380/mymaster");
        assert_eq!((master.as_str(), db), ("mymaster", None));
        assert_eq!(
            nodes.addresses(),
            [("s1".to_owned(), 26379), ("s2".to_owned(), 26380)]
        );
        let (nodes, master, db) = sentinel("rediss+sentinel://:pw@s1/mymaster/3");
        assert_eq!((master.as_str(), db), ("mymaster", Some(3)));
        assert_eq!(nodes.addresses(), [("s1".to_owned(), 26379)]);
        assert_eq!(
            nodes.node_url("10.0.0.5", 6380, db),
            "rediss://:pw@10.0.0.5:6380/3"
        );
        assert_eq!(nodes.node_url("::1", 6380, None), "rediss://:pw@[::1]:6380");
        assert_eq!(
            nodes.without_credentials().node_url("s1", 26379, None),
            "rediss://s1:26379"
        );
    }

    #[test]
    fn malformed_cluster_and_sentinel_urls_are_usage_errors_on_one_line() {
        for (url, says) in [
            ("redis+sentinel://s1:26379", "no master name"),
            ("redis+sentinel://s1/m/x", "not a number"),
            ("redis+sentinel://s1/m/0/extra", "/MASTER or /MASTER/DB"),
            ("redis+cluster://a:7000,,b:7001", "empty host"),
            ("redis+cluster://a:port", "not a number"),
            ("redis+cluster://a:7000/3", "only database 0"),
            ("redis+cluster://::1:7000", "[brackets]"),
            ("redis+cluster://u:secret@a:7000?x=1", "query parameters"),
        ] {
            let err = parse(url).unwrap_err();
            assert_eq!(err.code(), exit::USAGE, "{url}");
            let text = err.to_string();
            assert!(text.contains(says), "{url}: {text}");
            assert!(text.starts_with("bad --url "), "{url}: {text}");
            assert!(!text.contains('\n'), "{url}: {text}");
            assert!(!text.contains("secret"), "{url}: {text}");
        }
    }

    #[test]
    fn a_port_out_of_range_is_named() {
        for (url, port) in [
            ("redis://127.0.0.1:99999", "99999"),
            ("rediss://u:p@db:65536/0", "65536"),
            ("redis://[::1]:70000", "70000"),
            ("redis://db:6x79", "6x79"),
        ] {
            assert_eq!(bad_port(url).as_deref(), Some(port), "{url}");
            let err = parse(url).unwrap_err();
            assert_eq!(err.code(), exit::USAGE, "{url}");
            let text = err.to_string();
            assert!(
                text.contains(&format!(
                    "the port \"{port}\" is not a number from 1 to 65535"
                )),
                "{url}: {text}"
            );
        }
        for url in [
            "redis://db:6379",
            "redis://db",
            "redis://[::1]",
            "unix:///tmp/r.sock",
        ] {
            assert_eq!(bad_port(url), None, "{url}");
        }
        assert!(
            !parse("rediss://u:secret@db:65536")
                .unwrap_err()
                .to_string()
                .contains("secret")
        );
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redacted("redis://app:s3cret@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redacted("redis://db:6379"), "redis://db:6379");
    }
}
