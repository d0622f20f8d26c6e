//! The registry and the library: every `lua/*.lua` operation file is registered once and
//! states its contract, and every operation loads as a script and as a function.

use std::collections::BTreeMap;

use redsem_test::{RedisServer, within};

use super::*;
use crate::script::test_support::{LIMIT, connect};

/// Redis commands that only the runtime in `common.lua` sends: the time (`TIME`), keep-alive
/// (`PERSIST`, `PEXPIRE`, `PEXPIREAT`) and wake-ups (`PUBLISH`, after the state is saved).
const RUNTIME_ONLY: [&str; 5] = ["TIME", "PUBLISH", "PERSIST", "PEXPIRE", "PEXPIREAT"];

/// Every `lua/*.lua` file by its stem, with its text.
fn lua_files() -> BTreeMap<String, String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("the lua directory") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "lua") {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("a utf-8 name");
            let text = std::fs::read_to_string(&path).expect("a lua file");
            files.insert(stem.to_owned(), text);
        }
    }
    files
}

/// What is wrong with the header of operation `name`: the comment lines it starts with must
/// say, in this order, `-- <name>: <what it does>`, then `-- KEYS...`, `-- ARGV...` and
/// `-- Returns: ...`.
fn header_faults(name: &str, text: &str) -> Vec<String> {
    let header: Vec<&str> = text.lines().take_while(|l| l.starts_with("--")).collect();
    let mut faults = Vec::new();
    let says_what = header
        .first()
        .and_then(|l| l.strip_prefix(&format!("-- {name}: ")));
    if says_what.is_none_or(|what| what.trim().is_empty()) {
        faults.push(format!(
            "{name}.lua: the first line is not `-- {name}: <what it does>`"
        ));
    }
    let mut after = 0;
    for part in ["-- KEYS", "-- ARGV", "-- Returns:"] {
        match header.iter().skip(after).position(|l| l.starts_with(part)) {
            Some(at) => after += at + 1,
            None => faults.push(format!(
                "{name}.lua: its header has no `{part}` line (after the ones before it)"
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
    let mut faults = Vec::new();
    for (name, text) in &files {
        if name == "common" {
            continue;
        }
        let called = runtime_calls(text);
        if !called.is_empty() {
            faults.push(format!(
                "{name}.lua calls {called:?}: only the runtime in common.lua may"
            ));
        }
        if name.ends_with("_prelude") {
            continue;
        }
        match ALL.iter().filter(|op| op.name == name).count() {
            1 => {}
            0 => faults.push(format!("{name}.lua is not registered in ops!")),
            n => faults.push(format!("{name}.lua is registered {n} times in ops!")),
        }
        faults.extend(header_faults(name, text));
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
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
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
