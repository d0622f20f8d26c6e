//! The differential runner: the same seeded sequence of calls, sent to two engines of the
//! protocol in one server, each on its own copy of the keys; after every call the replies,
//! what each published and the full contents of the semaphore's keys (types, members,
//! expiries) must be the same. The first difference stops the run with the calls that led
//! to it.
//!
//! Both engines read the same planted clock (see [`engine`]), so tokens, lease ends and
//! expiries are equal to the microsecond; the runner moves it on between calls.

pub mod dump;
pub mod engine;
pub mod ops;

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use redis::Connection;
use redsem_test::RedisServer;

use engine::{Engine, plant_clock};
pub use engine::{EngineKind, Patch};
use ops::{Fault, Generator, SEMAPHORES, SIDE, Step, semaphore_keys};

/// What a run compares, and how long.
#[derive(Debug, Clone)]
pub struct Config {
    /// The seed of the call sequence.
    pub seed: u64,
    /// How many calls.
    pub steps: u64,
    /// The two engines compared.
    pub engines: [EngineKind; 2],
    /// Changes to the second engine's library (a bug put back, to show the runner sees it).
    pub patches: Vec<Patch>,
    /// The module to load, for the native engine (crates/redsem-module's
    /// `libredsem_module.so`).
    pub module: Option<std::path::PathBuf>,
}

impl Config {
    /// The `redis-server` arguments a run of this configuration needs (the module, if an
    /// engine is native).
    pub fn server_args(&self) -> Result<Vec<String>, String> {
        if !self.engines.contains(&EngineKind::Native) {
            return Ok(Vec::new());
        }
        if self.engines == [EngineKind::Native; 2] {
            return Err(
                "the native engine can be compared with a Lua engine, not with itself".to_owned(),
            );
        }
        let module = self
            .module
            .as_deref()
            .ok_or("the native engine needs the module's path (libredsem_module.so)")?;
        Ok(engine::module_args(module))
    }
}

/// The first difference between the two engines.
#[derive(Debug, Clone)]
pub struct Divergence {
    /// The number of the call (from 1).
    pub step: u64,
    /// What differed: "reply", "published" or a key's name.
    pub what: String,
    /// The first engine's, with its side's name as the second's.
    pub first: String,
    /// The second engine's.
    pub second: String,
    /// The calls up to it, oldest first (the last 30).
    pub history: Vec<String>,
    /// The first engine's keys of the semaphore just before the call, as read.
    pub before: Vec<String>,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "the engines differ at call {} in {}:",
            self.step, self.what
        )?;
        writeln!(f, "  first:  {}", self.first)?;
        writeln!(f, "  second: {}", self.second)?;
        writeln!(f, "the calls before it, last one last:")?;
        for line in &self.history {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "the first engine's keys before it:")?;
        for line in &self.before {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Calls sent to each engine.
    pub steps: u64,
    /// Calls per operation.
    pub calls: BTreeMap<&'static str, u64>,
    /// Calls whose reply the client lost, and resends (or late copies).
    pub lost: u64,
    /// Resends and late copies.
    pub resends: u64,
    /// Faults (foreign values, lost keys).
    pub faults: u64,
    /// The distinct replies seen (their first word), per operation: what the run reached.
    pub outcomes: BTreeMap<String, u64>,
    /// The first difference, if any.
    pub divergence: Option<Divergence>,
}

/// The side names of the two engines, in keys, channels and ids.
const SIDES: [&str; 2] = ["~A~", "~B~"];

fn sided(text: &str, side: usize) -> String {
    text.replace(SIDE, SIDES[side])
}

/// The first engine's text as the second's would read.
fn as_second(text: &str) -> String {
    text.replace(SIDES[0], SIDES[1])
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn failed(what: &str) -> impl FnOnce(redis::RedisError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A key's value, put aside while a foreign one stands in its place.
struct Aside {
    key: String,
    dump: Option<Vec<u8>>,
    expires: i64,
}

/// `key`'s value and expiry, to be put back after the step.
fn set_aside(conn: &mut Connection, key: &str) -> Result<Aside, String> {
    let dump: Option<Vec<u8>> = redis::cmd("DUMP")
        .arg(key)
        .query(conn)
        .map_err(failed("DUMP"))?;
    let expires: i64 = redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(conn)
        .map_err(failed("PEXPIRETIME"))?;
    Ok(Aside {
        key: key.to_owned(),
        dump,
        expires,
    })
}

fn plant_foreign(conn: &mut Connection, key: &str, string_key: bool) -> Result<Aside, String> {
    let aside = set_aside(conn, key)?;
    let mut pipe = redis::pipe();
    pipe.del(key).ignore();
    if string_key {
        pipe.rpush(key, "foreign").ignore();
    } else {
        pipe.set(key, "foreign").ignore();
    }
    pipe.query::<()>(conn).map_err(failed("a foreign value"))?;
    Ok(aside)
}

/// Put `text` at `key` (a string key), its own value set aside.
fn plant_text(conn: &mut Connection, key: &str, text: &str) -> Result<Aside, String> {
    let aside = set_aside(conn, key)?;
    redis::cmd("SET")
        .arg(key)
        .arg(text)
        .query::<()>(conn)
        .map_err(failed("an odd text"))?;
    Ok(aside)
}

fn put_back(conn: &mut Connection, aside: Aside) -> Result<(), String> {
    redis::cmd("DEL")
        .arg(&aside.key)
        .query::<()>(conn)
        .map_err(failed("DEL"))?;
    if let Some(dump) = aside.dump {
        let mut restore = redis::cmd("RESTORE");
        restore
            .arg(&aside.key)
            .arg(aside.expires.max(0))
            .arg(dump)
            .arg("REPLACE");
        if aside.expires > 0 {
            restore.arg("ABSTTL");
        }
        restore.query::<()>(conn).map_err(failed("RESTORE"))?;
    }
    Ok(())
}

/// Run `config` on a fresh server of its own.
pub fn run_fresh(config: &Config) -> Result<Report, String> {
    let args = config.server_args()?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = RedisServer::start_with(&args);
    run(&server, config)
}

/// Run `config` against `server` (its keys and functions are replaced).
pub fn run(server: &RedisServer, config: &Config) -> Result<Report, String> {
    let mut conn = server.connection();
    redis::cmd("FLUSHALL")
        .query::<()>(&mut conn)
        .map_err(failed("FLUSHALL"))?;
    let engines = [
        Engine::load(&mut conn, config.engines[0], "diff_first", &[])?,
        Engine::load(&mut conn, config.engines[1], "diff_second", &config.patches)?,
    ];
    let mut published =
        dump::Published::subscribe(server.connection()).map_err(failed("PSUBSCRIBE"))?;
    // A day ahead of the server's clock: no TTL the scripts set from it ends in real time
    // while the run lasts, so Redis never expires a key behind the engines' backs.
    let mut clock = now_micros() + 86_400_000_000;
    let mut generator = Generator::new(config.seed);
    let mut report = Report::default();
    let mut history: Vec<String> = Vec::new();
    for number in 1..=config.steps {
        let step = generator.next_step();
        clock += step.advance_us;
        plant_clock(&mut conn, clock).map_err(failed("planting the clock"))?;
        history.push(step.describe());
        if history.len() > 30 {
            history.remove(0);
        }
        *report.calls.entry(step.op).or_default() += 1;
        report.lost += u64::from(step.lost);
        report.resends += u64::from(step.resend);
        report.faults += u64::from(step.fault.is_some());

        let mut before = Vec::new();
        for key in step.keys() {
            let read = dump::key(&mut conn, &sided(&key, 0)).map_err(failed("reading a key"))?;
            before.push(format!("{key}: {read}"));
        }
        let (replies, put_aside) = call_both(&mut conn, &engines, &step)?;
        let divergence = |what: &str, first: &str, second: &str| Divergence {
            step: number,
            what: what.to_owned(),
            first: as_second(first),
            second: second.to_owned(),
            history: history.clone(),
            before: before.clone(),
        };
        let rendered = replies.each_ref().map(dump::render);
        if as_second(&rendered[0]) != rendered[1] {
            report.divergence = Some(divergence("reply", &rendered[0], &rendered[1]));
            return Ok(report);
        }
        let messages = published
            .take()
            .map_err(failed("reading published messages"))?;
        let of = |side: usize| -> Vec<String> {
            messages
                .iter()
                .filter(|m| m.contains(SIDES[side]))
                .cloned()
                .collect()
        };
        let (first, second) = (of(0), of(1));
        let first_read: Vec<String> = first.iter().map(|m| as_second(m)).collect();
        if first_read != second {
            report.divergence = Some(divergence(
                "published",
                &format!("{first:?}"),
                &format!("{second:?}"),
            ));
            return Ok(report);
        }
        if let Some((key, first, second)) = differing_key(&mut conn, step.keys())? {
            report.divergence = Some(divergence(&key, &first, &second));
            return Ok(report);
        }
        for aside in put_aside {
            put_back(&mut conn, aside)?;
        }
        for outcome in outcomes(&replies[0]) {
            *report
                .outcomes
                .entry(format!("{} {outcome}", step.op))
                .or_default() += 1;
        }
        generator.observe(&step, &replies[0], &first);
        report.steps = number;
    }
    // At the end, every semaphore's keys once more (the steps compared only their own).
    for primitive in [
        ops::Primitive::Lease,
        ops::Primitive::Permit,
        ops::Primitive::Latch,
    ] {
        for sem in 0..SEMAPHORES {
            if let Some((key, first, second)) =
                differing_key(&mut conn, semaphore_keys(primitive, sem))?
            {
                report.divergence = Some(Divergence {
                    step: config.steps,
                    what: key,
                    first: as_second(&first),
                    second,
                    history,
                    before: Vec::new(),
                });
                return Ok(report);
            }
        }
    }
    Ok(report)
}

/// The first word of a reply ("GRANTED"), or of each reply in a batch's.
fn outcomes(reply: &redis::Value) -> Vec<String> {
    let first_word = |value: &redis::Value| match value {
        redis::Value::Array(items) => items.first().map(dump::render).unwrap_or_default(),
        other => dump::render(other),
    };
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Array(inner)) => inner
                .iter()
                .map(|r| format!("{} (batched)", first_word(r).trim_matches('"')))
                .collect(),
            _ => vec![first_word(reply).trim_matches('"').to_owned()],
        },
        other => vec![first_word(other).trim_matches('"').to_owned()],
    }
}

/// The first of `keys` whose two copies differ: its name and both as read.
fn differing_key(
    conn: &mut Connection,
    keys: Vec<String>,
) -> Result<Option<(String, String, String)>, String> {
    let real_ms = i64::try_from(now_micros() / 1000).unwrap_or(i64::MAX);
    for key in keys {
        let first = dump::key(conn, &sided(&key, 0)).map_err(failed("reading a key"))?;
        let second = dump::key(conn, &sided(&key, 1)).map_err(failed("reading a key"))?;
        if !first.same_as(&second, as_second, real_ms) {
            return Ok(Some((key, first.to_string(), second.to_string())));
        }
    }
    Ok(None)
}

/// Apply the step's fault and send it to both engines: their replies, and the values put
/// aside for a foreign one (put back after the comparison of what was published).
fn call_both(
    conn: &mut Connection,
    engines: &[Engine; 2],
    step: &Step,
) -> Result<([redis::Value; 2], Vec<Aside>), String> {
    let keys = step.keys();
    let mut aside = Vec::new();
    for side in 0..2 {
        let keys: Vec<String> = keys.iter().map(|k| sided(k, side)).collect();
        match step.fault {
            Some(Fault::Lose(index)) => {
                redis::cmd("DEL")
                    .arg(&keys[index])
                    .query::<()>(conn)
                    .map_err(failed("DEL"))?;
            }
            Some(Fault::LoseAll) => {
                redis::cmd("DEL")
                    .arg(&keys)
                    .query::<()>(conn)
                    .map_err(failed("DEL"))?;
            }
            Some(Fault::OddText(index, which)) => {
                aside.push(plant_text(conn, &keys[index], ops::ODD_TEXTS[which])?);
            }
            Some(Fault::Foreign(index)) => {
                aside.push(plant_foreign(
                    conn,
                    &keys[index],
                    ops::is_string_key(step.primitive, index),
                )?);
            }
            None => {}
        }
    }
    let replies = [0, 1].map(|side| {
        let keys: Vec<String> = keys.iter().map(|k| sided(k, side)).collect();
        let args: Vec<String> = step.args.iter().map(|a| sided(a, side)).collect();
        engines[side].call(conn, step.op, &keys, &args)
    });
    Ok((replies, aside))
}
