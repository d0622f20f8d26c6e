//! What the runner compares, as text: replies, the full contents of keys (with their expiry)
//! and the messages published.

use std::fmt::Write as _;
use std::time::Duration;

use redis::{Connection, Value};

/// A reply as one line of text: numbers, texts (escaped), nested arrays, errors.
pub fn render(value: &Value) -> String {
    let mut out = String::new();
    render_into(value, &mut out);
    out
}

fn render_into(value: &Value, out: &mut String) {
    match value {
        Value::Nil => out.push_str("nil"),
        Value::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Value::BulkString(bytes) => {
            let _ = write!(out, "{:?}", String::from_utf8_lossy(bytes));
        }
        Value::Array(items) | Value::Set(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_into(item, out);
            }
            out.push(']');
        }
        Value::SimpleString(text) => {
            let _ = write!(out, "+{text}");
        }
        Value::Okay => out.push_str("+OK"),
        Value::ServerError(e) => {
            let _ = write!(out, "error {:?} {:?}", e.code(), e.details());
        }
        other => {
            let _ = write!(out, "{other:?}");
        }
    }
}

/// A key as read: its type and members in a fixed order (one line; "none" if absent), and
/// its expiry (absolute, ms; negative if none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDump {
    /// Its type and members.
    pub contents: String,
    /// Its expiry, from PEXPIRETIME.
    pub expires: i64,
}

impl KeyDump {
    /// Whether `other` holds the same, `self` read in the second engine's names. Expiries
    /// set from the planted clock (at least a day ahead of real time) must be equal; those
    /// given relative to the server's own clock (SET ... PX) may differ by the moments
    /// between the two calls.
    pub fn same_as(&self, other: &KeyDump, rename: impl Fn(&str) -> String, real_ms: i64) -> bool {
        let relative = |e: i64| e > 0 && e < real_ms + 43_200_000;
        let expiry_same = if relative(self.expires) && relative(other.expires) {
            (self.expires - other.expires).abs() <= 2_000
        } else {
            self.expires == other.expires
        };
        expiry_same && rename(&self.contents) == other.contents
    }
}

impl std::fmt::Display for KeyDump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (expires {})", self.contents, self.expires)
    }
}

/// The contents of `key` (see [`KeyDump`]).
pub fn key(conn: &mut Connection, key: &str) -> redis::RedisResult<KeyDump> {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn)?;
    if kind == "none" {
        return Ok(KeyDump {
            contents: "none".to_owned(),
            expires: -2,
        });
    }
    let expires: i64 = redis::cmd("PEXPIRETIME").arg(key).query(conn)?;
    let body = match kind.as_str() {
        "string" => {
            let value: Vec<u8> = redis::cmd("GET").arg(key).query(conn)?;
            format!("{:?}", String::from_utf8_lossy(&value))
        }
        "hash" => {
            let mut pairs: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query(conn)?;
            pairs.sort();
            format!("{pairs:?}")
        }
        "zset" => {
            let members: Vec<(String, String)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(conn)?;
            format!("{members:?}")
        }
        "list" => {
            let items: Vec<String> = redis::cmd("LRANGE").arg(key).arg(0).arg(-1).query(conn)?;
            format!("{items:?}")
        }
        "set" => {
            let mut items: Vec<String> = redis::cmd("SMEMBERS").arg(key).query(conn)?;
            items.sort();
            format!("{items:?}")
        }
        other => format!("(a {other})"),
    };
    Ok(KeyDump {
        contents: format!("{kind} {body}"),
        expires,
    })
}

/// A connection subscribed to every channel: after each step it collects, in order, what the
/// engines published.
pub struct Published {
    conn: Connection,
}

impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Published")
    }
}

impl Published {
    /// Subscribe `conn` to every channel.
    pub fn subscribe(mut conn: Connection) -> redis::RedisResult<Published> {
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        conn.send_packed_command(&redis::cmd("PSUBSCRIBE").arg("*").get_packed_command())?;
        // The subscription's confirmation.
        conn.recv_response()?;
        Ok(Published { conn })
    }

    /// Every message published since the last call, as "channel message", in order: a PING
    /// sent now is answered after every message published before it.
    pub fn take(&mut self) -> redis::RedisResult<Vec<String>> {
        self.conn
            .send_packed_command(&redis::cmd("PING").get_packed_command())?;
        let mut messages = Vec::new();
        loop {
            let reply = self.conn.recv_response()?;
            let Value::Array(parts) = reply else {
                continue;
            };
            let texts: Vec<String> = parts
                .iter()
                .map(|part| match part {
                    Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    other => render(other),
                })
                .collect();
            match texts.first().map(String::as_str) {
                Some("pong") => return Ok(messages),
                Some("pmessage") if texts.len() == 4 => {
                    messages.push(format!("{} {}", texts[2], texts[3]));
                }
                _ => {}
            }
        }
    }
}
