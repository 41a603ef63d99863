//! `tracing` setup shared by every subcommand: level from OPENSHELL_LOG_LEVEL (or `--log-level`),
//! overridden by RUST_LOG when set; human or JSON lines on stderr.
//!
//! With `--log-format json`, every line the supervisor itself writes on stderr is JSON: besides
//! the log events, `run`'s summary, usage errors and `main`'s final error line go through
//! [`json_line`], in the same shape as the events of tracing-subscriber's JSON formatter
//! (`timestamp`, `level`, `fields.message`, `target`). The child's stderr is the child's:
//! `run` passes it through unchanged (`--merge-output` sends it to stdout instead).
//!
//! Colour only where a person reads it: stderr is a terminal and `NO_COLOR` is unset or empty
//! (no-color.org). Pod logs (`kubectl logs`) and files never get escape codes.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

/// `--log-format`: how the supervisor's own lines on stderr are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

static JSON: AtomicBool = AtomicBool::new(false);

fn console_filter(level: &str) -> EnvFilter {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.is_empty())
        .and_then(|s| EnvFilter::try_new(s).ok())
        .or_else(|| EnvFilter::try_new(level).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"))
}

/// Install the global subscriber. Safe to call more than once (later calls are no-ops).
pub fn init(level: &str, format: LogFormat) {
    let filter = console_filter(level);
    let ansi = colour_stderr();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let installed = match format {
        LogFormat::Human => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if installed.is_ok() {
        JSON.store(format == LogFormat::Json, Ordering::Relaxed);
    }
}

/// Whether our lines on stderr may carry colour: stderr is a terminal and `NO_COLOR` is unset
/// or empty.
pub fn colour_stderr() -> bool {
    no_color_unset(std::env::var_os("NO_COLOR").as_deref())
        && std::io::IsTerminal::is_terminal(&std::io::stderr())
}

/// no-color.org: any non-empty value turns colour off.
fn no_color_unset(v: Option<&std::ffi::OsStr>) -> bool {
    v.is_none_or(|v| v.is_empty())
}

/// Whether stderr is in JSON mode (`--log-format json`).
pub fn json_enabled() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Write one JSON line on stderr, shaped like a tracing event: `{"timestamp", "level",
/// "fields": {"message", ...extra}, "target"}`. `extra` must be a JSON object; its keys go
/// into `fields`. A failed write is ignored: after SIGHUP stderr may be a hung-up terminal.
pub fn json_line(level: &str, message: &str, extra: Option<serde_json::Value>) {
    let mut fields = serde_json::Map::new();
    fields.insert("message".into(), message.into());
    if let Some(serde_json::Value::Object(m)) = extra {
        fields.extend(m);
    }
    let line = serde_json::json!({
        "timestamp": rfc3339(std::time::SystemTime::now()),
        "level": level,
        "fields": fields,
        "target": "openshell_sandbox",
    });
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// `2026-12-01T09:11:39.123456Z`: RFC 3339 in UTC with microseconds.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.microsecond()
    )
}

/// `serve`'s subscriber: the console as [`init`], plus `extra` (the gateway log push layer,
/// filtered at its own level, so a quiet console still pushes INFO). The caller builds `extra`,
/// so this floor module knows nothing of the gateway.
pub fn init_with_layer<L>(level: &str, format: LogFormat, extra: L)
where
    L: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    use tracing_subscriber::prelude::*;
    let filter = console_filter(level);
    let ansi = colour_stderr();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(extra);
    let installed = match format {
        LogFormat::Human => registry
            .with(fmt.with_target(false).with_filter(filter))
            .try_init(),
        LogFormat::Json => registry.with(fmt.json().with_filter(filter)).try_init(),
    };
    if installed.is_ok() {
        JSON.store(format == LogFormat::Json, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_non_empty_no_color_turns_colour_off() {
        assert!(super::no_color_unset(None));
        assert!(super::no_color_unset(Some("".as_ref())));
        assert!(!super::no_color_unset(Some("1".as_ref())));
        assert!(!super::no_color_unset(Some("0".as_ref())));
    }

    #[test]
    fn rfc3339_is_utc_with_microseconds() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(1_764_580_299_000_042);
        assert_eq!(super::rfc3339(t), "2025-12-01T09:11:39.000042Z");
    }
}
