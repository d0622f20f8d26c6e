//! The registry and the library: every `lua/` file is common.lua, a prelude's or an operation
//! registered once that states its contract, and every operation loads as a script and as a
//! function.

use std::collections::BTreeMap;

use redsem_test::{RedisServer, within};

use super::*;
use crate::script::test_support::{LIMIT, connect_plain};

/// Redis commands that only the runtime in `common.lua` sends: the time (`TIME`), keep-alive
/// (`PERSIST`, `PEXPIRE`, `PEXPIREAT`) and wake-ups (`PUBLISH`, after the state is saved).
const RUNTIME_ONLY: [&str; 5] = ["TIME", "PUBLISH", "PERSIST", "PEXPIRE", "PEXPIREAT"];

/// Every `.lua` file under `lua/` by its path there without `.lua` (`lease/acquire`), with
/// its text.
fn lua_files() -> BTreeMap<String, String> {
    fn walk(dir: &std::path::Path, prefix: &str, files: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("a lua directory") {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_name()
                .and_then(|s| s.to_str())
                .expect("a utf-8 name");
            if path.is_dir() {
                walk(&path, &format!("{prefix}{name}/"), files);
            } else if let Some(stem) = name.strip_suffix(".lua") {
                let text = std::fs::read_to_string(&path).expect("a lua file");
                files.insert(format!("{prefix}{stem}"), text);
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/lua")),
        "",
        &mut files,
    );
    files
}

/// What is wrong with the header of operation `name` (its file `file`): the comment lines it
/// starts with must say, in this order, `-- <name>: <what it does>`, then `-- KEYS...`,
/// `-- ARGV...` and `-- Returns: ...`.
fn header_faults(name: &str, file: &str, text: &str) -> Vec<String> {
    let header: Vec<&str> = text.lines().take_while(|l| l.starts_with("--")).collect();
    let mut faults = Vec::new();
    let says_what = header
        .first()
        .and_then(|l| l.strip_prefix(&format!("-- {name}: ")));
    if says_what.is_none_or(|what| what.trim().is_empty()) {
        faults.push(format!(
            "{file}.lua: the first line is not `-- {name}: <what it does>`"
        ));
    }
    let mut after = 0;
    for part in ["-- KEYS", "-- ARGV", "-- Returns:"] {
        match header.iter().skip(after).position(|l| l.starts_with(part)) {
            Some(at) => after += at + 1,
            None => faults.push(format!(
                "{file}.lua: its header has no `{part}` line (after the ones before it)"
            )),
        }
    }
    faults
}

/// The commands of [`RUNTIME_ONLY`] that the code of `text` (its comments left out) names as
/// a quoted string, as `redis.call('TIME')` does (in any case).
fn runtime_calls(text: &str) -> Vec<&'static str> {
    let code: String = text
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
        .to_ascii_uppercase();
    RUNTIME_ONLY
        .into_iter()
        .filter(|cmd| code.contains(&format!("'{cmd}'")) || code.contains(&format!("\"{cmd}\"")))
        .collect()
}

#[test]
fn every_operation_file_is_registered_once_states_its_contract_and_leaves_the_runtime_to_common() {
    let files = lua_files();
    let prelude: Vec<(Primitive, &str)> = [Primitive::Lease, Primitive::Permit, Primitive::Latch]
        .into_iter()
        .flat_map(|p| p.prelude_files().iter().map(move |(file, _)| (p, *file)))
        .collect();
    let mut faults = Vec::new();
    for (file, text) in &files {
        if file == "common" {
            continue;
        }
        let called = runtime_calls(text);
        if !called.is_empty() {
            faults.push(format!(
                "{file}.lua calls {called:?}: only the runtime in common.lua may"
            ));
        }
        let ops: Vec<&&Op> = ALL.iter().filter(|op| op.file == file).collect();
        let topic = prelude.iter().filter(|(_, f)| f == file).count();
        match (ops.as_slice(), topic) {
            ([], 1) => {}
            ([op], 0) => faults.extend(header_faults(op.name, file, text)),
            ([], 0) => faults.push(format!(
                "{file}.lua is neither an operation in ops! nor a prelude's file"
            )),
            _ => faults.push(format!(
                "{file}.lua is listed {} times in ops! and the preludes",
                ops.len() + topic
            )),
        }
    }
    for (primitive, file) in &prelude {
        if !file.starts_with(&format!("{primitive:?}/").to_ascii_lowercase()) {
            faults.push(format!("{file}.lua is not in the folder of {primitive:?}"));
        }
    }
    for op in ALL {
        if !files.contains_key(op.file) {
            faults.push(format!("{}: no file {}.lua", op.name, op.file));
        }
        let folder = format!("{:?}/", op.primitive).to_ascii_lowercase();
        if !op.file.starts_with(&folder) || !op.name.starts_with(&folder.replace('/', "_")) {
            faults.push(format!(
                "{} ({}.lua) is not in the folder of {:?}",
                op.name, op.file, op.primitive
            ));
        }
    }
    assert!(
        faults.is_empty(),
        "{} operation file fault(s):\n  {}",
        faults.len(),
        faults.join("\n  ")
    );
}

#[tokio::test]
async fn every_operation_loads_as_a_script_and_as_a_function() {
    // About the Lua library itself: a server without the module and a plain connection,
    // whatever engine the other script tests run on (REDSEM_TEST_MODULE).
    let server = RedisServer::start();
    let mut conn = connect_plain(&server).await;
    for op in ALL {
        let script = op.script();
        let sha = within(
            LIMIT,
            "SCRIPT LOAD",
            script.prepare_invoke().load_async(&mut conn),
        )
        .await
        .unwrap_or_else(|e| panic!("{} compiles as a script: {e}", op.name));
        assert_eq!(sha, script.get_hash());
    }
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&LIBRARY.source)
        .query_async(&mut conn)
        .await
        .expect("the library loads");
    assert_eq!(name, LIBRARY.name);
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(&LIBRARY.name)
        .query_async(&mut conn)
        .await
        .expect("FUNCTION LIST");
    let listed = format!("{listed:?}");
    for op in ALL {
        assert!(listed.contains(op.function()), "{} registered", op.name);
    }
}

/// The errors the client tells apart are told apart on the server under test, in its own
/// words (Redis 6.2 quotes an unknown command in backquotes, Valkey names
/// `server.register_function`, ...): a function it lacks, functions it has not or refuses, a
/// command of redsem's module it has not. CI runs this on Redis 7.0, Valkey 8.1 and 9.1.
#[tokio::test]
async fn each_servers_own_refusals_are_recognised_by_their_kind() {
    let server = RedisServer::start();
    let mut conn = connect_plain(&server).await;
    let fcall: redis::RedisResult<redis::Value> = within(
        LIMIT,
        "FCALL",
        redis::cmd("FCALL")
            .arg("redsem_nosuch_op")
            .arg(1)
            .arg("k")
            .query_async(&mut conn),
    )
    .await;
    let fcall = fcall.expect_err("no such function");
    assert!(functions_unusable(&fcall), "{fcall}");
    let has_functions = !fcall
        .to_string()
        .to_ascii_lowercase()
        .contains("unknown command");
    if has_functions {
        assert!(unknown_function(&fcall), "{fcall}");
    }
    let load: redis::RedisResult<String> = within(
        LIMIT,
        "FUNCTION LOAD",
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("#!lua name=bad\nredis.register_function(1, 2)")
            .query_async(&mut conn),
    )
    .await;
    let load = load.expect_err("a library that does not register");
    assert!(functions_unusable(&load), "{load}");
    assert!(!unknown_function(&load), "{load}");
    let module: redis::RedisResult<redis::Value> = within(
        LIMIT,
        "REDSEM.LEASE_STATUS",
        redis::cmd("REDSEM.LEASE_STATUS")
            .arg("k")
            .query_async(&mut conn),
    )
    .await;
    let module = module.expect_err("no module");
    assert!(crate::engine::module_missing(&module), "{module}");
    assert!(!unknown_function(&module), "{module}");
    if has_functions {
        let () = within(
            LIMIT,
            "ACL SETUSER",
            redis::cmd("ACL")
                .arg(&[
                    "SETUSER", "apikey", "on", "nopass", "~*", "&*", "+@all", "-fcall",
                ])
                .query_async(&mut conn),
        )
        .await
        .expect("ACL SETUSER");
        let mut refused =
            redis::Client::open(format!("redis://apikey:x@127.0.0.1:{}", server.port()))
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect as apikey");
        let noperm: redis::RedisResult<redis::Value> = within(
            LIMIT,
            "FCALL as apikey",
            redis::cmd("FCALL")
                .arg("redsem_nosuch_op")
                .arg(1)
                .arg("k")
                .query_async(&mut refused),
        )
        .await;
        let noperm = noperm.expect_err("FCALL refused");
        assert!(functions_unusable(&noperm), "{noperm}");
        assert!(!unknown_function(&noperm), "{noperm}");
    }
}
