//! The engines the soak's clients ask for (docs/SOAK.md "The engines"): the choice, the
//! check that each client is served by it, and the report of what the server counted.

use std::time::Duration;

use redsem::{Engine, Redsem, ServingEngine};

use super::history::{self, Meta};

/// Which engine the soak's clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EngineMode {
    /// Every client `Engine::Scripts` (the Lua library by `FCALL`).
    Scripts,
    /// Every client `Engine::Native` (redsem's module, `REDSEM.<OP>`).
    Native,
    /// Clients alternate, client 0 native, client 1 scripts, ..., on the same semaphores.
    Mixed,
}

impl EngineMode {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            EngineMode::Scripts => "scripts",
            EngineMode::Native => "native",
            EngineMode::Mixed => "mixed",
        }
    }

    /// The engine client `c` asks for (the control client asks as client 0).
    pub(super) fn client(self, c: usize) -> Engine {
        match self {
            EngineMode::Scripts => Engine::Scripts,
            EngineMode::Native => Engine::Native,
            EngineMode::Mixed if c.is_multiple_of(2) => Engine::Native,
            EngineMode::Mixed => Engine::Scripts,
        }
    }
}

/// How many clients report another engine at the end than the one they asked for.
pub(super) fn engine_fallbacks(meta: &Meta) -> usize {
    meta.client_engines_at_end
        .iter()
        .zip(&meta.client_engines)
        .filter(|(end, asked)| end != asked)
        .count()
}

/// The line before the summary: each client's engine (asked and checked at connect, and at
/// the end), and what the server that took writes at the end counted.
pub(super) fn engine_report(meta: &Meta) -> String {
    let engine = meta.engine.as_deref().unwrap_or("scripts");
    let mut text = format!("engine: {engine}");
    if !meta.client_engines.is_empty() {
        let clients: Vec<String> = meta
            .client_engines
            .iter()
            .enumerate()
            .map(|(c, e)| match meta.client_engines_at_end.get(c) {
                Some(end) if end != e => format!("client{c} {e}, at the end {end}"),
                _ => format!("client{c} {e}"),
            })
            .collect();
        text.push_str(&format!(" ({})", clients.join(", ")));
    }
    if let Some(calls) = &meta.server_calls {
        // The module runs its Lua by `FCALL` within the command, which the server counts
        // among its `FCALL`s.
        let lua = calls.module_lua.unwrap_or(0);
        text.push_str(&format!(
            "; the primary since it last started: {} REDSEM.<OP>",
            calls.redsem_commands
        ));
        if let Some(native) = calls.native_paths {
            text.push_str(&format!(
                " ({native} by a native path, {lua} by the module's Lua)"
            ));
        }
        text.push_str(&format!(
            ", {} other FCALL",
            calls.fcall.saturating_sub(lua)
        ));
    }
    text
}

/// `Ok` if `redsem` reports being served by the engine it asked for, else what it reports.
pub(super) fn served_by(redsem: &Redsem, asked: Engine, who: &str) -> Result<(), String> {
    let served = redsem.engine();
    if served.name() == asked.as_str() {
        Ok(())
    } else {
        Err(format!(
            "{who} asked for the {asked} engine and is served by {}",
            describe(&served)
        ))
    }
}

/// The engine as `Redsem::engine()` reports it, with why the scripts.
pub(super) fn describe(served: &ServingEngine) -> String {
    match served {
        ServingEngine::Scripts { why, .. } => format!("scripts ({why})"),
        other => other.to_string(),
    }
}

/// What the server on `port` counted since it last started: its `REDSEM.<OP>` and `FCALL`
/// commands (`INFO commandstats`) and, with the module, `REDSEM.ENGINE`'s calls served by a
/// native path and by the Lua within. `None` if it does not answer.
pub(super) fn server_calls(port: u16) -> Option<history::ServerCalls> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .ok()?;
    let mut calls = history::ServerCalls::default();
    for line in stats.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let n: u64 = rest
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if name == "fcall" {
            calls.fcall += n;
        } else if name.starts_with("redsem.") && name != "redsem.engine" {
            calls.redsem_commands += n;
        }
    }
    // ["native", version, library, native calls, Lua calls]; an error without the module.
    let engine: redis::RedisResult<Vec<redis::Value>> = redis::cmd("REDSEM.ENGINE").query(&mut con);
    if let Ok(reply) = engine {
        let int = |i: usize| {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value_ref::<u64>(v).ok())
        };
        calls.native_paths = int(3);
        calls.module_lua = int(4);
    }
    Some(calls)
}

#[cfg(test)]
mod tests {
    use super::super::history::{self, Record};
    use super::*;

    #[test]
    fn mixed_alternates_native_first_and_the_others_ask_alike() {
        let asked = |mode: EngineMode| -> Vec<Engine> { (0..4).map(|c| mode.client(c)).collect() };
        assert_eq!(asked(EngineMode::Scripts), [Engine::Scripts; 4]);
        assert_eq!(asked(EngineMode::Native), [Engine::Native; 4]);
        assert_eq!(
            asked(EngineMode::Mixed),
            [
                Engine::Native,
                Engine::Scripts,
                Engine::Native,
                Engine::Scripts
            ]
        );
    }

    #[test]
    fn a_history_from_before_the_engine_choice_reads_as_scripts() {
        let line = r#"{"type":"meta","seed":7,"deployment":"single","capacity":{},"permits":{},"latch_count":12,"lease_ms":1000,"waiter_lease_ms":1000}"#;
        let records = history::read(line.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let Some(Record::Meta(meta)) = records.first() else {
            panic!("no meta in {records:?}")
        };
        assert_eq!(meta.engine, None);
        assert_eq!(engine_fallbacks(meta), 0);
        assert_eq!(engine_report(meta), "engine: scripts");
    }

    #[test]
    fn a_client_on_another_engine_at_the_end_is_counted_and_named() {
        let meta = Meta {
            engine: Some("mixed".into()),
            client_engines: vec!["native".into(), "scripts".into()],
            client_engines_at_end: vec!["scripts".into(), "scripts".into()],
            server_calls: Some(history::ServerCalls {
                redsem_commands: 10,
                fcall: 7,
                native_paths: Some(6),
                module_lua: Some(4),
            }),
            ..Meta::default()
        };
        assert_eq!(engine_fallbacks(&meta), 1);
        assert_eq!(
            engine_report(&meta),
            "engine: mixed (client0 native, at the end scripts, client1 scripts); the primary \
             since it last started: 10 REDSEM.<OP> (6 by a native path, 4 by the module's Lua), \
             3 other FCALL"
        );
    }
}
