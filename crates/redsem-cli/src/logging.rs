//! Logs on stderr through `tracing`: off by default, `-v` for info, `-vv` for debug, `-vvv`
//! for trace; `RUST_LOG` (`info`, `redsem=debug,warn`, ...) overrides `-v`.

use std::io::IsTerminal as _;
use std::str::FromStr;

use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

pub(crate) fn init(verbosity: u8) {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .and_then(|s| Targets::from_str(&s).ok());
    let filter = from_env.unwrap_or_else(|| {
        let level = match verbosity {
            0 => LevelFilter::OFF,
            1 => LevelFilter::INFO,
            2 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        };
        Targets::new().with_default(level)
    });
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(verbosity > 1);
    // Fails only if a subscriber is already set, which cannot happen in this binary.
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
}
