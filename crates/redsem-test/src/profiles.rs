//! Managed Redis services, emulated: one [`Profile`] per kind of service (grouped where they
//! refuse the same commands), each an ACL user on a throwaway [`RedisServer`] that is refused
//! what that service refuses, so that a test can log in as it and see what breaks.
//!
//! Each list comes from the service's public page on restricted commands, named in
//! [`Profile::source`] (read in 2025/2026; the services change them). A list keeps only the
//! commands the page names; subcommands are written as ACL rules write them (`client|kill`).
//! What the emulation cannot show:
//!
//! * how the service words its refusal: a refused command answers `NOPERM` here, where a
//!   service may answer `ERR unknown command` (Azure says so; [`Profile::start_server`] renames
//!   `CONFIG` and `DEBUG` away for the Azure profile, so that both forms are exercised);
//! * what a service changes beyond refusing: ElastiCache Serverless runs every cache in
//!   cluster mode and turns `PUBLISH` inside a script into `SPUBLISH`, Upstash answers `INFO`
//!   with some sections only, and so on. Those need their own tests.
//!
//! ```no_run
//! use redsem_test::{RedisServer, profiles};
//!
//! for profile in profiles::ALL {
//!     let server = profile.start_server();
//!     let url = profile.login(&server);
//!     // ... connect to `url` and use redsem as that service's user would.
//!     # let _ = url;
//! }
//! ```

use crate::RedisServer;

/// The password of every profile's user.
const PASSWORD: &str = "pw";

/// One kind of managed service: the commands its users are refused.
#[derive(Debug)]
pub struct Profile {
    /// A short name, also the ACL user's name (`elasticache-serverless`).
    pub name: &'static str,
    /// The services it stands for.
    pub services: &'static str,
    /// The public page the list comes from.
    pub source: &'static str,
    /// What the user may not run (ACL command names, `command|subcommand` for one subcommand).
    /// With [`Profile::allowed_only`], the user may run nothing else.
    pub refused: &'static [&'static str],
    /// For services that publish the commands they accept rather than the ones they refuse:
    /// the only commands the user may run.
    pub allowed_only: Option<&'static [&'static str]>,
    /// Commands renamed away on the profile's server (`rename-command NAME ""`), so that they
    /// answer `ERR unknown command` to everyone, as the service's refusal does.
    pub unknown: &'static [&'static str],
    /// Whether redsem can work there at all (a service that refuses every script cannot).
    pub usable: bool,
}

/// The commands the node-based AWS services (ElastiCache clusters and MemoryDB) refuse. Both
/// lists, taken together (MemoryDB adds `MODULE`, ElastiCache the cluster subcommands it names).
///
/// * ElastiCache, node-based: <https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/SupportedCommands.html>
///   ("Restricted Valkey and Redis OSS commands"; the shorter list of
///   <https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/ClientConfig.RestrictedCommands.html>
///   is a part of it)
/// * MemoryDB: <https://docs.aws.amazon.com/memorydb/latest/devguide/restrictedcommands.html>
const AWS_NODE_BASED: &[&str] = &[
    "acl|setuser",
    "acl|load",
    "acl|save",
    "acl|deluser",
    "bgrewriteaof",
    "bgsave",
    "cluster|addslots",
    "cluster|addslotsrange",
    "cluster|bumpepoch",
    "cluster|delslots",
    "cluster|delslotsrange",
    "cluster|failover",
    "cluster|flushslots",
    "cluster|forget",
    "cluster|links",
    "cluster|meet",
    "cluster|setslot",
    "config",
    "debug",
    "migrate",
    "module",
    "psync",
    "replicaof",
    "save",
    "slaveof",
    "shutdown",
    "sync",
];

/// ElastiCache Serverless refuses what the node-based clusters refuse, and these too: "In
/// addition, the following commands are unavailable for serverless caches" on
/// <https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/SupportedCommands.html>.
/// (`commandlog` is a Valkey 8.1 command; on a server without it the rule is left out.)
/// [`AWS_SERVERLESS`] is both lists; a test checks it.
#[cfg(test)]
const AWS_SERVERLESS_MORE: &[&str] = &[
    "acl|log",
    "client|caching",
    "client|getredir",
    "client|id",
    "client|info",
    "client|kill",
    "client|list",
    "client|no-evict",
    "client|pause",
    "client|tracking",
    "client|trackinginfo",
    "client|unblock",
    "client|unpause",
    "cluster|count-failure-reports",
    "commandlog",
    "fcall",
    "fcall_ro",
    "function",
    "keys",
    "lastsave",
    "latency",
    "memory",
    "monitor",
    "move",
    "object",
    "pfdebug",
    "pfselftest",
    "psubscribe",
    "pubsub|numpat",
    "punsubscribe",
    "script|kill",
    "slowlog",
    "swapdb",
    "wait",
];

/// The two lists of ElastiCache Serverless, as one.
const AWS_SERVERLESS: &[&str] = &[
    "acl|setuser",
    "acl|load",
    "acl|save",
    "acl|deluser",
    "bgrewriteaof",
    "bgsave",
    "cluster|addslots",
    "cluster|addslotsrange",
    "cluster|bumpepoch",
    "cluster|delslots",
    "cluster|delslotsrange",
    "cluster|failover",
    "cluster|flushslots",
    "cluster|forget",
    "cluster|links",
    "cluster|meet",
    "cluster|setslot",
    "config",
    "debug",
    "migrate",
    "psync",
    "replicaof",
    "save",
    "slaveof",
    "shutdown",
    "sync",
    "acl|log",
    "client|caching",
    "client|getredir",
    "client|id",
    "client|info",
    "client|kill",
    "client|list",
    "client|no-evict",
    "client|pause",
    "client|tracking",
    "client|trackinginfo",
    "client|unblock",
    "client|unpause",
    "cluster|count-failure-reports",
    "commandlog",
    "fcall",
    "fcall_ro",
    "function",
    "keys",
    "lastsave",
    "latency",
    "memory",
    "monitor",
    "move",
    "object",
    "pfdebug",
    "pfselftest",
    "psubscribe",
    "pubsub|numpat",
    "punsubscribe",
    "script|kill",
    "slowlog",
    "swapdb",
    "wait",
];

/// Google Memorystore for Redis (the instance product, not Memorystore for Redis Cluster,
/// which accepts a list of commands and answers `NOPERM` to the rest): "Blocked Redis
/// commands" on <https://cloud.google.com/memorystore/docs/redis/product-constraints> (the
/// same on <https://cloud.google.com/memorystore/docs/redis/supported-commands>). Every `ACL`
/// subcommand is on it, so all of `ACL`; all of `CLIENT`, `CLUSTER`, `COMMAND`, `CONFIG`.
const MEMORYSTORE: &[&str] = &[
    "acl",
    "bgrewriteaof",
    "bgsave",
    "client",
    "cluster",
    "command",
    "config",
    "debug",
    "lastsave",
    "migrate",
    "monitor",
    "object",
    "shutdown",
    "replicaof",
    "save",
];

/// Azure Cache for Redis (Basic, Standard, Premium): "Redis commands not supported in Azure
/// Cache for Redis" on
/// <https://learn.microsoft.com/azure/azure-cache-for-redis/cache-configure#redis-commands-not-supported-in-azure-cache-for-redis>.
/// "Cluster write commands are disabled, but read-only cluster commands are permitted": the
/// cluster subcommands that change the cluster. Refused with `ERR unknown command`, so the
/// profile's server also renames `CONFIG` and `DEBUG` away ([`AZURE_UNKNOWN`]).
const AZURE: &[&str] = &[
    "acl",
    "bgrewriteaof",
    "bgsave",
    "cluster|addslots",
    "cluster|addslotsrange",
    "cluster|bumpepoch",
    "cluster|delslots",
    "cluster|delslotsrange",
    "cluster|failover",
    "cluster|flushslots",
    "cluster|forget",
    "cluster|meet",
    "cluster|replicate",
    "cluster|reset",
    "cluster|saveconfig",
    "cluster|set-config-epoch",
    "cluster|setslot",
    "config",
    "debug",
    "migrate",
    "psync",
    "replicaof",
    "replconf",
    "save",
    "shutdown",
    "slaveof",
    "sync",
];

/// The commands of [`AZURE`] that its profile's server answers with `ERR unknown command`.
const AZURE_UNKNOWN: &[&str] = &["CONFIG", "DEBUG"];

/// Upstash Redis publishes the commands it accepts: "Redis® API Compatibility" on
/// <https://upstash.com/docs/redis/overall/rediscompatibility>, the table as it stood with
/// "Redis client protocol up to version 6.2" (github.com/upstash/docs,
/// `redis/overall/rediscompatibility.mdx` at e9840f7). Nothing else is accepted: no `INFO`,
/// `CONFIG`, `CLIENT`, `WAIT`, `FUNCTION` or `FCALL`, no cluster. (The page now speaks of
/// protocol 8.2 and lists functions, `INFO` with some sections, `CONFIG GET`: the older list is
/// the harder one, and kept.) The JSON commands are left out (a module this server lacks).
const UPSTASH: &[&str] = &[
    // String
    "append",
    "decr",
    "decrby",
    "get",
    "getdel",
    "getex",
    "getrange",
    "getset",
    "incr",
    "incrby",
    "incrbyfloat",
    "mget",
    "mset",
    "msetnx",
    "psetex",
    "set",
    "setex",
    "setnx",
    "setrange",
    "strlen", // Bitmap
    "bitcount",
    "bitfield",
    "bitfield_ro",
    "bitop",
    "bitpos",
    "getbit",
    "setbit", // Hash
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hincrby",
    "hincrbyfloat",
    "hkeys",
    "hlen",
    "hmget",
    "hmset",
    "hscan",
    "hset",
    "hsetnx",
    "hstrlen",
    "hrandfield",
    "hvals", // List
    "blmove",
    "blmpop",
    "blpop",
    "brpop",
    "brpoplpush",
    "lindex",
    "linsert",
    "llen",
    "lmove",
    "lmpop",
    "lpop",
    "lpos",
    "lpush",
    "lpushx",
    "lrange",
    "lrem",
    "lset",
    "ltrim",
    "rpop",
    "rpoplpush",
    "rpush",
    "rpushx", // Set
    "sadd",
    "scard",
    "sdiff",
    "sdiffstore",
    "sinter",
    "sintercard",
    "sinterstore",
    "sismember",
    "smembers",
    "smismember",
    "smove",
    "spop",
    "srandmember",
    "srem",
    "sscan",
    "sunion",
    "sunionstore", // SortedSet
    "bzmpop",
    "bzpopmax",
    "bzpopmin",
    "zadd",
    "zcard",
    "zcount",
    "zdiff",
    "zdiffstore",
    "zincrby",
    "zinter",
    "zintercard",
    "zinterstore",
    "zlexcount",
    "zmpop",
    "zmscore",
    "zpopmax",
    "zpopmin",
    "zrandmember",
    "zrange",
    "zrangestore",
    "zrangebylex",
    "zrangebyscore",
    "zrank",
    "zrem",
    "zremrangebylex",
    "zremrangebyrank",
    "zremrangebyscore",
    "zrevrange",
    "zrevrangebylex",
    "zrevrangebyscore",
    "zrevrank",
    "zscan",
    "zscore",
    "zunion",
    "zunionstore", // Geo
    "geoadd",
    "geodist",
    "geohash",
    "geopos",
    "georadius",
    "georadius_ro",
    "georadiusbymember",
    "georadiusbymember_ro",
    "geosearch",
    "geosearchstore", // HyperLogLog
    "pfadd",
    "pfcount",
    "pfmerge", // Scripting
    "eval",
    "evalsha",
    "script|exists",
    "script|load",
    "script|flush", // Pub/Sub
    "subscribe",
    "psubscribe",
    "unsubscribe",
    "punsubscribe",
    "publish",
    "pubsub",
    // Transactions
    "discard",
    "exec",
    "multi",
    "unwatch",
    "watch", // Generic
    "copy",
    "del",
    "dump",
    "exists",
    "expire",
    "expireat",
    "expiretime",
    "keys",
    "persist",
    "pexpire",
    "pexpireat",
    "pexpiretime",
    "pttl",
    "randomkey",
    "rename",
    "renamenx",
    "restore",
    "scan",
    "touch",
    "ttl",
    "type",
    "unlink", // Connection
    "auth",
    "hello",
    "echo",
    "ping",
    "quit",
    "reset",
    "select", // Server
    "acl",
    "dbsize",
    "flushall",
    "flushdb",
    "monitor",
    "time",
];

/// OCI Cache, "Unsupported Valkey and Redis Commands" on
/// <https://docs.oracle.com/iaas/Content/ocicache/restrictedcommands.htm>: the commands no
/// cluster supports (of `CONFIG`, `CONFIG SET` only).
const OCI: &[&str] = &[
    "acl",
    "bgrewriteaof",
    "bgsave",
    "cluster",
    "config|set",
    "debug",
    "migrate",
    "module",
    "psync",
    "replicaof",
    "save",
    "shutdown",
    "sync",
];

/// OCI Cache's sharded clusters refuse the scripts as well: [`OCI`] and the commands the same
/// page supports "only for non-sharded clusters".
const OCI_SHARDED: &[&str] = &[
    "acl",
    "bgrewriteaof",
    "bgsave",
    "cluster",
    "config|set",
    "debug",
    "migrate",
    "module",
    "psync",
    "replicaof",
    "save",
    "shutdown",
    "sync",
    "eval",
    "eval_ro",
    "evalsha",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
    "function",
    "script",
];

/// AWS ElastiCache node-based clusters and MemoryDB.
pub const AWS_NODE_BASED_PROFILE: Profile = Profile {
    name: "elasticache-memorydb",
    services: "AWS ElastiCache (node-based) and Amazon MemoryDB",
    source: "https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/SupportedCommands.html, \
             https://docs.aws.amazon.com/memorydb/latest/devguide/restrictedcommands.html",
    refused: AWS_NODE_BASED,
    allowed_only: None,
    unknown: &[],
    usable: true,
};

/// AWS ElastiCache Serverless.
pub const AWS_SERVERLESS_PROFILE: Profile = Profile {
    name: "elasticache-serverless",
    services: "AWS ElastiCache Serverless",
    source: "https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/SupportedCommands.html",
    refused: AWS_SERVERLESS,
    allowed_only: None,
    unknown: &[],
    usable: true,
};

/// Google Memorystore for Redis.
pub const MEMORYSTORE_PROFILE: Profile = Profile {
    name: "memorystore",
    services: "Google Memorystore for Redis",
    source: "https://cloud.google.com/memorystore/docs/redis/product-constraints",
    refused: MEMORYSTORE,
    allowed_only: None,
    unknown: &[],
    usable: true,
};

/// Azure Cache for Redis.
pub const AZURE_PROFILE: Profile = Profile {
    name: "azure",
    services: "Azure Cache for Redis",
    source: "https://learn.microsoft.com/azure/azure-cache-for-redis/cache-configure#redis-commands-not-supported-in-azure-cache-for-redis",
    refused: AZURE,
    allowed_only: None,
    unknown: AZURE_UNKNOWN,
    usable: true,
};

/// Upstash Redis.
pub const UPSTASH_PROFILE: Profile = Profile {
    name: "upstash",
    services: "Upstash Redis",
    source: "https://upstash.com/docs/redis/overall/rediscompatibility",
    refused: &[],
    allowed_only: Some(UPSTASH),
    unknown: &[],
    usable: true,
};

/// OCI Cache, non-sharded.
pub const OCI_PROFILE: Profile = Profile {
    name: "oci",
    services: "OCI Cache (non-sharded)",
    source: "https://docs.oracle.com/iaas/Content/ocicache/restrictedcommands.htm",
    refused: OCI,
    allowed_only: None,
    unknown: &[],
    usable: true,
};

/// OCI Cache, sharded: no scripts, so no redsem.
pub const OCI_SHARDED_PROFILE: Profile = Profile {
    name: "oci-sharded",
    services: "OCI Cache (sharded clusters)",
    source: "https://docs.oracle.com/iaas/Content/ocicache/restrictedcommands.htm",
    refused: OCI_SHARDED,
    allowed_only: None,
    unknown: &[],
    usable: false,
};

/// Every profile, the unusable one last.
pub const ALL: [&Profile; 7] = [
    &AWS_NODE_BASED_PROFILE,
    &AWS_SERVERLESS_PROFILE,
    &MEMORYSTORE_PROFILE,
    &AZURE_PROFILE,
    &UPSTASH_PROFILE,
    &OCI_PROFILE,
    &OCI_SHARDED_PROFILE,
];

/// The profiles redsem can work on ([`Profile::usable`]).
pub fn usable() -> impl Iterator<Item = &'static Profile> {
    ALL.into_iter().filter(|p| p.usable)
}

impl Profile {
    /// Whether the user of this profile is refused `command` (a command name, or
    /// `command|subcommand`; any case).
    pub fn refuses(&self, command: &str) -> bool {
        let command = command.to_ascii_lowercase();
        let parent = command.split('|').next().unwrap_or_default().to_owned();
        let listed = |list: &[&str]| list.iter().any(|c| *c == command || *c == parent);
        match self.allowed_only {
            Some(allowed) => !listed(allowed),
            None => listed(self.refused),
        }
    }

    /// Start a throwaway server for this profile: [`RedisServer::start`], with
    /// [`Profile::unknown`] renamed away.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start_with`].
    pub fn start_server(&self) -> RedisServer {
        let mut args = Vec::new();
        for command in self.unknown {
            args.push("--rename-command".to_owned());
            args.push((*command).to_owned());
            args.push(String::new());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        RedisServer::start_with(&args)
    }

    /// Create this profile's ACL user on `server` (every key and channel; every command but
    /// the refused ones, or only the allowed ones) and return the URL that logs in as it.
    /// A rule naming a command the server does not have (newer than it) is left out.
    ///
    /// # Panics
    ///
    /// If `ACL SETUSER` fails for another reason.
    pub fn login(&self, server: &RedisServer) -> String {
        let mut admin = server.connection();
        let base = match self.allowed_only {
            Some(_) => "-@all",
            None => "+@all",
        };
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(self.name)
            .arg(&["reset", "on", &format!(">{PASSWORD}"), "~*", "&*", base])
            .query(&mut admin)
            .unwrap_or_else(|e| panic!("ACL SETUSER {}: {e}", self.name));
        let rules: Vec<String> = match self.allowed_only {
            Some(allowed) => allowed.iter().map(|c| format!("+{c}")).collect(),
            None => self.refused.iter().map(|c| format!("-{c}")).collect(),
        };
        for rule in rules {
            let set: redis::RedisResult<()> = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(self.name)
                .arg(&rule)
                .query(&mut admin);
            match set {
                Ok(()) => {}
                // A command this server does not have (e.g. Valkey's COMMANDLOG on Redis 7).
                Err(e) if e.to_string().contains("nknown command") => {}
                Err(e) => panic!("ACL SETUSER {} {rule}: {e}", self.name),
            }
        }
        format!(
            "redis://{}:{PASSWORD}@127.0.0.1:{}",
            self.name,
            server.port()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serverless_list_is_the_node_based_list_and_the_serverless_additions() {
        let node_based: Vec<&str> = AWS_NODE_BASED
            .iter()
            .copied()
            .filter(|c| *c != "module")
            .collect();
        let both: Vec<&str> = node_based
            .iter()
            .chain(AWS_SERVERLESS_MORE)
            .copied()
            .collect();
        assert_eq!(both, AWS_SERVERLESS);
    }

    #[test]
    fn refusals_match_whole_commands_and_subcommands() {
        assert!(AWS_SERVERLESS_PROFILE.refuses("CLIENT|NO-EVICT"));
        assert!(!AWS_SERVERLESS_PROFILE.refuses("client|setname"));
        assert!(MEMORYSTORE_PROFILE.refuses("client|setname"));
        assert!(UPSTASH_PROFILE.refuses("info"));
        assert!(!UPSTASH_PROFILE.refuses("evalsha"));
        assert!(OCI_PROFILE.refuses("config|set"));
        assert!(!OCI_PROFILE.refuses("config|get"));
    }
}
