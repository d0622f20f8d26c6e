//! The keys check: in the tests, every Lua operation runs with each Redis command it sends
//! checked first, so that a script that touches a key it was not given in `KEYS` (a name
//! built inside Lua, a key left out of the call) fails the test that runs it, whatever path
//! of whatever operation it is on. Cluster proxies (ElastiCache Serverless, Alibaba's proxy,
//! Envoy, twemproxy's successors) route a script by its `KEYS` and refuse, or silently
//! misroute, a key it did not declare; a function called with no keys they cannot route at
//! all.
//!
//! How: the library and the scripts of a test build ([`instrument`], applied by `assemble`
//! and `Op::script` under `cfg(test)`) have every `redis.call` and `redis.pcall` in their
//! text (and so `rcall`, `rpcall` and common.lua's `call()`, which are bound to them)
//! replaced by a checked twin, and every operation starts by naming its `KEYS` to the
//! checker. The checker knows each command's key positions from [`KEY_POSITIONS`] (first,
//! last, step, as `COMMAND INFO` gives them; a test checks the table against the server's
//! own answer), and raises, naming the command and the key, when one of those arguments is
//! not one of the call's `KEYS`; a command missing from the table raises too, so a new
//! command in a script makes its tests fail until it is added here. `SPUBLISH`'s channel is
//! no key: it must carry the hash tag of the call's first key (it must be in the keys' slot).
//! An operation called with no keys raises before anything runs.
//!
//! The error passes out of the operation as an error reply (common.lua's `caught()` turns a
//! raised text into one), which no script test expects.

/// Every command the scripts send, with its key positions: `(name, first, last, step)`,
/// positions counted from the command's name (0), a negative last counted from the end (-1:
/// the last argument), first 0: no keys. As `COMMAND INFO` gives them (checked by a test).
pub(super) const KEY_POSITIONS: &[(&str, i64, i64, i64)] = &[
    ("BITCOUNT", 1, 1, 1),
    ("BITPOS", 1, 1, 1),
    ("DECR", 1, 1, 1),
    ("DECRBY", 1, 1, 1),
    ("DEL", 1, -1, 1),
    ("EXISTS", 1, -1, 1),
    ("GET", 1, 1, 1),
    ("GETBIT", 1, 1, 1),
    ("HDEL", 1, 1, 1),
    ("HGET", 1, 1, 1),
    ("HGETALL", 1, 1, 1),
    ("HINCRBY", 1, 1, 1),
    ("HLEN", 1, 1, 1),
    ("HMGET", 1, 1, 1),
    ("HSET", 1, 1, 1),
    ("INCR", 1, 1, 1),
    ("INCRBY", 1, 1, 1),
    ("PERSIST", 1, 1, 1),
    ("PEXPIRE", 1, 1, 1),
    ("PEXPIREAT", 1, 1, 1),
    ("PTTL", 1, 1, 1),
    ("PUBLISH", 0, 0, 0),
    ("SET", 1, 1, 1),
    ("SETBIT", 1, 1, 1),
    ("SETRANGE", 1, 1, 1),
    ("SPUBLISH", 1, 1, 1),
    ("STRLEN", 1, 1, 1),
    ("TIME", 0, 0, 0),
    ("TYPE", 1, 1, 1),
    ("ZADD", 1, 1, 1),
    ("ZCARD", 1, 1, 1),
    ("ZLEXCOUNT", 1, 1, 1),
    ("ZRANGE", 1, 1, 1),
    ("ZRANGEBYLEX", 1, 1, 1),
    ("ZRANGEBYSCORE", 1, 1, 1),
    ("ZRANK", 1, 1, 1),
    ("ZREM", 1, 1, 1),
    ("ZREMRANGEBYRANK", 1, 1, 1),
    ("ZREMRANGEBYSCORE", 1, 1, 1),
    ("ZREVRANGEBYSCORE", 1, 1, 1),
    ("ZSCORE", 1, 1, 1),
];

/// The checker, as Lua locals put in front of the instrumented text.
fn checker() -> String {
    let mut table = String::from("local KEY_CHECK_POSITIONS = {\n");
    for (name, first, last, step) in KEY_POSITIONS {
        table.push_str(&format!("  {name} = {{ {first}, {last}, {step} }},\n"));
    }
    table.push_str("}\n");
    table + CHECKER
}

const CHECKER: &str = r#"local KEY_CHECK_KEYS, KEY_CHECK_TAG = {}, nil
local function key_check_tag(name)
  local open = string.find(name, '{', 1, true)
  if open then
    local close = string.find(name, '}', open + 1, true)
    if close and close > open + 1 then
      return string.sub(name, open + 1, close - 1)
    end
  end
  return name
end
local function key_check_begin(keys)
  if #keys == 0 then
    error('redsem key check: an operation called with no keys')
  end
  KEY_CHECK_KEYS, KEY_CHECK_TAG = {}, key_check_tag(keys[1])
  for i = 1, #keys do
    KEY_CHECK_KEYS[keys[i]] = true
  end
end
local function key_check(...)
  local args = { ... }
  local name = string.upper(tostring(args[1]))
  local at = KEY_CHECK_POSITIONS[name]
  if not at then
    error('redsem key check: ' .. name .. ' is not in KEY_POSITIONS (script/library/key_check.rs): add its key positions there')
  end
  if name == 'SPUBLISH' then
    if key_check_tag(tostring(args[2])) ~= KEY_CHECK_TAG then
      error('redsem key check: SPUBLISH to ' .. tostring(args[2]) .. ', outside the slot of the keys {' .. tostring(KEY_CHECK_TAG) .. '}')
    end
    return
  end
  local first, last, step = at[1], at[2], at[3]
  if first == 0 then
    return
  end
  if last < 0 then
    last = #args + last
  end
  for p = first, last, step do
    local key = args[p + 1]
    if key == nil or not KEY_CHECK_KEYS[key] then
      error('redsem key check: ' .. name .. ' touches ' .. tostring(key) .. ', which is not in KEYS')
    end
  end
end
local function key_checked_call(...)
  key_check(...)
  return redis.call(...)
end
local function key_checked_pcall(...)
  key_check(...)
  return redis.pcall(...)
end
"#;

/// `text` (the library after its `#!lua` line, or a script) with every `redis.call` and
/// `redis.pcall` checked and every `begin(KEYS)` preceded by naming the keys to the checker,
/// the checker in front.
fn instrument_text(text: &str) -> String {
    let text = text
        .replace("redis.pcall", "key_checked_pcall")
        .replace("redis.call", "key_checked_call")
        .replace("\nbegin(KEYS)\n", "\nkey_check_begin(KEYS)\nbegin(KEYS)\n");
    format!("{}{text}", checker())
}

/// The library's or a script's source, instrumented: a library keeps its `#!lua` line first.
pub(super) fn instrument(source: &str) -> String {
    match source.split_once('\n') {
        Some((shebang, rest)) if shebang.starts_with("#!lua") => {
            format!("{shebang}\n{}", instrument_text(rest))
        }
        _ => instrument_text(source),
    }
}

#[cfg(test)]
mod tests {
    use redsem_test::{RedisServer, within};

    use super::*;
    use crate::script::library::{ALL, LIBRARY};
    use crate::script::test_support::{LIMIT, connect_plain};

    #[test]
    fn every_operation_names_its_keys_to_the_checker_before_it_begins() {
        let begun = LIBRARY.source.matches("key_check_begin(KEYS)").count();
        assert_eq!(begun, ALL.len(), "one check per registered function");
        for op in ALL {
            let code = op.script().get_hash();
            assert!(!code.is_empty());
        }
        // Only the checker itself calls Redis unchecked.
        for call in ["redis.call", "redis.pcall"] {
            assert_eq!(
                LIBRARY.source.matches(call).count(),
                CHECKER.matches(call).count(),
                "{call} outside the checker"
            );
        }
    }

    /// The table agrees with the server: each command's first key, last key and step are what
    /// `COMMAND INFO` says, and none of them finds its keys some other way (movable keys).
    #[tokio::test]
    async fn key_positions_are_the_servers() {
        let server = RedisServer::start();
        let mut conn = connect_plain(&server).await;
        for &(name, first, last, step) in KEY_POSITIONS {
            let info: redis::Value = within(
                LIMIT,
                "COMMAND INFO",
                redis::cmd("COMMAND")
                    .arg("INFO")
                    .arg(name)
                    .query_async(&mut conn),
            )
            .await
            .expect("COMMAND INFO");
            let redis::Value::Array(entries) = info else {
                panic!("COMMAND INFO {name}: {info:?}");
            };
            let Some(redis::Value::Array(entry)) = entries.first() else {
                // A command this server lacks (SPUBLISH before Redis 7).
                continue;
            };
            let number = |at: usize| match entry.get(at) {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("COMMAND INFO {name}: field {at} is {other:?}"),
            };
            assert_eq!(
                (number(3), number(4), number(5)),
                (first, last, step),
                "{name}'s key positions"
            );
            let flags = format!("{:?}", entry.get(2));
            assert!(
                !flags.to_ascii_lowercase().contains("movablekeys"),
                "{name} has movable keys: {flags}"
            );
        }
    }

    /// A call whose keys are all empty (a key given as an empty slice) is not sent.
    #[tokio::test]
    async fn a_call_without_keys_is_not_sent() {
        // (With the module's engine under test, its server loads the module.)
        let server = crate::script::test_support::start_server(&[]);
        let mut conn = crate::script::test_support::connect(&server).await;
        let err = within(
            LIMIT,
            "no keys",
            crate::script::library::LEASE_STATUS
                .key(Vec::<String>::new())
                .invoke_async::<redis::Value>(&mut conn),
        )
        .await
        .expect_err("refused before it is sent");
        assert_eq!(err.kind(), redis::ErrorKind::Client, "{err}");
        assert!(err.to_string().contains("lease_status"), "{err}");
    }

    /// The checker fails a script that touches a key it was not given, and lets one that
    /// touches only its own run.
    #[tokio::test]
    async fn a_key_outside_keys_fails_the_call() {
        let server = RedisServer::start();
        let mut conn = connect_plain(&server).await;
        let script = |body: &str| {
            redis::Script::new(&instrument(&format!(
                "local function begin(keys) end\nbegin(KEYS)\n{body}"
            )))
        };
        let own: String = within(
            LIMIT,
            "own key",
            script("redis.call('SET', KEYS[1], 'x') return redis.call('GET', KEYS[1])")
                .key("{t}:a")
                .invoke_async(&mut conn),
        )
        .await
        .expect("a script on its own key runs");
        assert_eq!(own, "x");
        let outside = within(
            LIMIT,
            "built key",
            script("return redis.call('GET', KEYS[1] .. ':other')")
                .key("{t}:a")
                .invoke_async::<Option<String>>(&mut conn),
        )
        .await
        .expect_err("a key built in Lua is refused");
        assert!(
            outside
                .to_string()
                .contains("{t}:a:other, which is not in KEYS"),
            "{outside}"
        );
        let pcalled = within(
            LIMIT,
            "pcall",
            script("return redis.pcall('DEL', KEYS[1], 'elsewhere')")
                .key("{t}:a")
                .invoke_async::<i64>(&mut conn),
        )
        .await
        .expect_err("pcall is checked too");
        assert!(pcalled.to_string().contains("elsewhere"), "{pcalled}");
        let unlisted = within(
            LIMIT,
            "unlisted",
            script("return redis.call('LPUSH', KEYS[1], 'x')")
                .key("{t}:a")
                .invoke_async::<i64>(&mut conn),
        )
        .await
        .expect_err("a command not in the table is refused");
        assert!(
            unlisted.to_string().contains("LPUSH is not in"),
            "{unlisted}"
        );
        let no_keys = within(
            LIMIT,
            "no keys",
            script("return 1")
                .prepare_invoke()
                .invoke_async::<i64>(&mut conn),
        )
        .await
        .expect_err("no keys is refused");
        assert!(no_keys.to_string().contains("no keys"), "{no_keys}");
        let channel = within(
            LIMIT,
            "spublish",
            script("return redis.call('SPUBLISH', 'wake:{other}', 'm')")
                .key("{t}:a")
                .invoke_async::<i64>(&mut conn),
        )
        .await
        .expect_err("a sharded channel outside the slot is refused");
        assert!(
            channel.to_string().contains("outside the slot"),
            "{channel}"
        );
    }
}
