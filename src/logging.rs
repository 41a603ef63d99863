//! `tracing` setup shared by every subcommand: level from OPENSHELL_LOG_LEVEL (or `--log-level`),
//! overridden by RUST_LOG when set; human or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Install the global subscriber. Safe to call more than once (later calls are no-ops).
pub fn init(level: &str, format: LogFormat) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.is_empty())
        .and_then(|s| EnvFilter::try_new(s).ok())
        .or_else(|| EnvFilter::try_new(level).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    // Colour only on a terminal: pod logs (`kubectl logs`) must not fill with escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Human => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
