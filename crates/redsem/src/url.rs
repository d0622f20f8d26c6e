//! The URL forms [`Redsem::connect_with`](crate::Redsem::connect_with) reads besides the
//! `redis` crate's own: a cluster by its seed nodes and a primary watched by Sentinels.
//!
//! ```text
//! redis+cluster://[user:password@]host[:port][,host[:port]...]            (default port 6379)
//! redis+sentinel://[user:password@]host[:port][,host[:port]...]/master[/db] (default port 26379)
//! ```
//!
//! `rediss+cluster://` and `rediss+sentinel://` speak TLS to every node (and to the
//! Sentinels). The user and password are those of the data nodes; the Sentinels are asked
//! without them. Every other URL goes to the `redis` crate unchanged.

use crate::error::{Error, Result, invalid};

/// The default port of a cluster seed.
const REDIS_PORT: u16 = 6379;
/// The default port of a Sentinel.
const SENTINEL_PORT: u16 = 26379;

/// What a Redis URL names: one server, a Redis Cluster by its seed nodes, or the primary
/// that a set of Sentinels watches.
///
/// [`Redsem::connect`](crate::Redsem::connect) reads URLs this way; tools that open their own
/// connections to the nodes behind a URL (a health check, say) can read them the same way.
/// Neither [`Debug`] nor an error message shows a password.
///
/// ```
/// use redsem::ConnectTarget;
///
/// let target = ConnectTarget::parse("redis+sentinel://app:pw@s1,s2:26380/mymaster/2")?;
/// let ConnectTarget::Sentinel { sentinels, master, db, .. } = target else {
///     panic!("not a sentinel URL");
/// };
/// assert_eq!(master, "mymaster");
/// assert_eq!(db, Some(2));
/// assert_eq!(
///     sentinels.addresses(),
///     [("s1".to_owned(), 26379), ("s2".to_owned(), 26380)]
/// );
/// assert_eq!(sentinels.node_url("10.0.0.5", 6379, db), "redis://app:pw@10.0.0.5:6379/2");
/// assert!(!format!("{sentinels:?}").contains("pw"));
///
/// assert_eq!(ConnectTarget::parse("redis://localhost:6379/0")?, ConnectTarget::Server);
/// # Ok::<(), redsem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectTarget {
    /// One server: any URL other than the forms below (`redis://`, `rediss://`, `unix://`,
    /// ...), left as it is to the `redis` crate.
    Server,
    /// A Redis Cluster (`redis+cluster://`), reached through any of these seed nodes.
    Cluster(TargetHosts),
    /// The primary that these Sentinels (`redis+sentinel://`) watch under the name `master`.
    #[non_exhaustive]
    Sentinel {
        /// The Sentinels, with the TLS choice and credentials of the data nodes.
        sentinels: TargetHosts,
        /// The name the Sentinels monitor the primary under.
        master: String,
        /// The database after the master name, if one is given (0 otherwise).
        db: Option<u32>,
    },
}

/// The hosts of a cluster or sentinel URL, and how to reach the data nodes behind them.
///
/// [`Debug`] shows the user name only, never the password.
#[derive(Clone, PartialEq, Eq)]
pub struct TargetHosts {
    /// Whether every connection is TLS (`rediss+...`).
    tls: bool,
    /// `user:password`, `:password` or `user`, percent-encoded as written (empty if none).
    userinfo: String,
    /// `(host, port)` of each host, IPv6 without brackets.
    addresses: Vec<(String, u16)>,
}

impl std::fmt::Debug for TargetHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = match self.userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***"),
            None => self.userinfo.clone(),
        };
        f.debug_struct("TargetHosts")
            .field("tls", &self.tls)
            .field("user", &user)
            .field("addresses", &self.addresses)
            .finish()
    }
}

impl TargetHosts {
    /// Whether the nodes (and Sentinels) are reached over TLS (`rediss+cluster://`,
    /// `rediss+sentinel://`).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// `(host, port)` of every seed node or Sentinel, in the URL's order, with the default
    /// port (6379 for a seed, 26379 for a Sentinel) where none is given; IPv6 addresses
    /// without brackets.
    pub fn addresses(&self) -> &[(String, u16)] {
        &self.addresses
    }

    /// The `redis://` (or `rediss://`) URL of the data node at `host:port` (an address as
    /// `CLUSTER NODES` or a Sentinel gives it: IPv6 with or without brackets), with the
    /// user and password of the URL this was read from, and database `db` if given.
    ///
    /// The result holds the password: do not show it.
    pub fn node_url(&self, host: &str, port: u16, db: Option<u32>) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let auth = if self.userinfo.is_empty() {
            String::new()
        } else {
            format!("{}@", self.userinfo)
        };
        let host = if host.starts_with('[') {
            host.to_owned()
        } else {
            bracketed(host)
        };
        let db = db.map(|db| format!("/{db}")).unwrap_or_default();
        format!("{scheme}://{auth}{host}:{port}{db}")
    }

    /// The `redis://` (or `rediss://`) URL of every host, with the credentials, database 0:
    /// a cluster's seed nodes.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn node_urls(&self) -> Vec<String> {
        self.addresses
            .iter()
            .map(|(host, port)| self.node_url(host, *port, None))
            .collect()
    }

    /// The user name and password, percent-decoded (checked when the URL was read).
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) fn credentials(&self) -> (Option<String>, Option<String>) {
        credentials(&self.userinfo).unwrap_or_default()
    }

    /// The same hosts without a user or password: how the Sentinels are asked.
    pub fn without_credentials(&self) -> TargetHosts {
        TargetHosts {
            userinfo: String::new(),
            ..self.clone()
        }
    }
}

impl ConnectTarget {
    /// Read `url`. `redis+cluster://` and `redis+sentinel://` (and `rediss+...`, the scheme
    /// in any case) are read here; every other URL is [`ConnectTarget::Server`], for the
    /// `redis` crate to read when connecting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a malformed cluster or sentinel URL, saying which part
    /// is wrong; the message shows the URL with its password replaced by `***`.
    pub fn parse(url: &str) -> Result<ConnectTarget> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Ok(ConnectTarget::Server);
        };
        let (tls, sentinel) = match scheme.to_ascii_lowercase().as_str() {
            "redis+cluster" => (false, false),
            "rediss+cluster" => (true, false),
            "redis+sentinel" => (false, true),
            "rediss+sentinel" => (true, true),
            _ => return Ok(ConnectTarget::Server),
        };
        let bad = |why: &str| -> Error { invalid(format!("bad url {}: {why}", redact(url))) };
        if rest.contains(['?', '#']) {
            return Err(bad(
                "query parameters and fragments are not supported in cluster and sentinel URLs",
            ));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, host_list) = authority.rsplit_once('@').unwrap_or(("", authority));
        let default_port = if sentinel { SENTINEL_PORT } else { REDIS_PORT };
        let addresses = host_list
            .split(',')
            .map(|hp| split_host_port(hp, default_port).map_err(|why| bad(&why)))
            .collect::<Result<Vec<_>>>()?;
        let hosts = TargetHosts {
            tls,
            userinfo: userinfo.to_owned(),
            addresses,
        };
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        if !sentinel {
            return match parts.as_slice() {
                [] | ["0"] => Ok(ConnectTarget::Cluster(hosts)),
                _ => Err(bad(&format!(
                    "a cluster has only database 0, and {scheme}:// takes no path (got /{path})"
                ))),
            };
        }
        let (master, db) = match parts.as_slice() {
            [master] => (master, None),
            [master, db] => (
                master,
                Some(db.parse::<u32>().map_err(|_| {
                    bad(&format!(
                        "the database {db:?} after the master name is not a number"
                    ))
                })?),
            ),
            [] => {
                return Err(bad(&format!(
                    "no master name: {scheme}://host:26379[,host:port...]/MASTER[/DB], MASTER \
                     as in the Sentinels' `sentinel monitor MASTER ...`"
                )));
            }
            _ => {
                return Err(bad(&format!(
                    "the path is /MASTER or /MASTER/DB, not /{path}"
                )));
            }
        };
        credentials(userinfo)
            .map_err(|what| bad(&format!("the {what} is not valid percent-encoded UTF-8")))?;
        Ok(ConnectTarget::Sentinel {
            sentinels: hosts,
            master: (*master).to_owned(),
            db,
        })
    }
}

/// The user name and password of `userinfo`, percent-decoded (`None` for an empty one), or
/// which of the two is malformed.
fn credentials(
    userinfo: &str,
) -> std::result::Result<(Option<String>, Option<String>), &'static str> {
    let (username, password) = match userinfo.split_once(':') {
        _ if userinfo.is_empty() => (None, None),
        Some((user, password)) => (Some(user), Some(password)),
        None => (Some(userinfo), None),
    };
    let decode = |part: Option<&str>, what| match part {
        None | Some("") => Ok(None),
        Some(part) => percent_decode(part).map(Some).ok_or(what),
    };
    Ok((
        decode(username, "user name")?,
        decode(password, "password")?,
    ))
}

/// `url` with the password of its user part replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => userinfo.to_owned(),
    };
    format!("{scheme}://{user}{}", &rest[at..])
}

/// `host[:port]` or `[v6][:port]`, with `default_port` when there is none.
fn split_host_port(text: &str, default_port: u16) -> std::result::Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("no closing bracket in host {text:?}"))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("unexpected {after:?} after host [{host}]")),
            },
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err(format!("an IPv6 address needs [brackets]: {text:?}"));
            }
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(format!(
            "an empty host in the list (hosts are host[:port] separated by commas): {text:?}"
        ));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| format!("the port of {text:?} is not a number from 1 to 65535"))?,
    };
    Ok((host.to_owned(), port))
}

/// An IPv6 host in brackets, for a URL.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// Decode `%XX` escapes; `None` if one is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<ConnectTarget> {
        ConnectTarget::parse(url)
    }

    fn message(url: &str) -> String {
        match parse(url) {
            Err(Error::InvalidArgument(why)) => why,
            other => panic!("{url}: expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn plain_urls_are_left_to_the_redis_crate() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "rediss://user:pw@host/",
            "redis+unix:///tmp/redis.sock",
            "unix:///tmp/redis.sock",
            "not a url",
        ] {
            assert_eq!(parse(url).unwrap(), ConnectTarget::Server, "{url}");
        }
    }

    #[test]
    fn cluster_urls_give_a_seed_url_per_host_with_the_credentials() {
        let seeds = |url| match parse(url).unwrap() {
            ConnectTarget::Cluster(hosts) => hosts.node_urls(),
            other => panic!("{url}: not a cluster: {other:?}"),
        };
        assert_eq!(
            seeds("redis+cluster://10.0.0.1:7000,10.0.0.2,[::1]:7002"),
            vec![
                "redis://10.0.0.1:7000".to_owned(),
                "redis://10.0.0.2:6379".to_owned(),
                "redis://[::1]:7002".to_owned(),
            ]
        );
        assert_eq!(
            seeds("rediss+cluster://app:p%40ss@h:7000"),
            vec!["rediss://app:p%40ss@h:7000".to_owned()]
        );
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_the_master_and_the_database() {
        /// (TLS, sentinels, master, database, user, password, Debug of the hosts).
        type Read = (
            bool,
            Vec<(String, u16)>,
            String,
            u32,
            Option<String>,
            Option<String>,
            String,
        );
        let read = |url| -> Read {
            let ConnectTarget::Sentinel {
                sentinels,
                master,
                db,
            } = parse(url).unwrap()
            else {
                panic!("{url}: not a sentinel target");
            };
            let (user, password) = sentinels.credentials();
            let debug = format!("{sentinels:?}");
            let addresses = sentinels.addresses().to_vec();
            (
                sentinels.is_tls(),
                addresses,
                master,
                db.unwrap_or(0),
                user,
                password,
                debug,
            )
        };
        let (tls, sentinels, master, db, user, password, _) =
            read("redis+sentinel://s1,s2:26380,[::1]/mymaster/3");
        assert!(!tls);
        assert_eq!(
            sentinels,
            vec![
                ("s1".to_owned(), 26379),
                ("s2".to_owned(), 26380),
                ("::1".to_owned(), 26379)
            ]
        );
        assert_eq!(master, "mymaster");
        assert_eq!(db, 3);
        assert_eq!((user, password), (None, None));

        let (tls, _, _, db, user, password, debug) = read("rediss+sentinel://app:s%3Acret@s1:1/m/");
        assert!(tls);
        assert_eq!(db, 0);
        assert_eq!(user.as_deref(), Some("app"));
        assert_eq!(password.as_deref(), Some("s:cret"));
        assert!(!debug.contains("cret"));

        let (_, _, _, _, user, password, _) = read("redis+sentinel://:pw@s1/m");
        assert_eq!(user, None);
        assert_eq!(password.as_deref(), Some("pw"));
    }

    #[test]
    fn malformed_urls_say_what_is_wrong_without_the_password() {
        let cases = [
            ("redis+sentinel://u:hunter2@s1:26379", "no master name"),
            ("redis+sentinel://u:hunter2@s1/m/x", "not a number"),
            ("redis+sentinel://u:hunter2@s1/m/-1", "not a number"),
            (
                "redis+sentinel://u:hunter2@s1/m/0/more",
                "/MASTER or /MASTER/DB",
            ),
            ("redis+sentinel://u:hunter2@s1,,s2/m", "empty host"),
            ("redis+sentinel://u:hunter2@s1:99999/m", "not a number"),
            ("redis+sentinel://u:hunter2@s1:0/m", "not a number"),
            ("redis+cluster://u:hunter2@::1:7000", "[brackets]"),
            ("redis+sentinel://u:hunter2@[::1/m", "closing bracket"),
            ("redis+sentinel://u:hunter2@s1/m?db=1", "query parameters"),
            ("redis+cluster://u:hunter2@h:7000/2", "takes no path"),
            ("redis+cluster://u:hunter2@", "empty host"),
            ("redis+sentinel://u:hunter%zz@s1/m", "percent-encoded"),
        ];
        for (url, expected) in cases {
            let why = message(url);
            assert!(why.contains(expected), "{url}: {why}");
            assert!(!why.contains("hunter"), "{url}: the password leaked: {why}");
            assert!(why.contains("u:***@"), "{url}: {why}");
        }
    }

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:pw@h"), "redis://:***@h");
        assert_eq!(redact("redis://u@h"), "redis://u@h");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact("redis://p@ss:w@rd@h/"), "redis://p@ss:***@h/");
    }
}
