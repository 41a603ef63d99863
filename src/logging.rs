//! `tracing` setup shared by every subcommand: level from OPENSHELL_LOG_LEVEL (or `--log-level`),
//! overridden by RUST_LOG when set; human or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

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

/// `serve`'s subscriber: the console as [`init`], plus the gateway log push layer with its own
/// level (`OPENSHELL_LOG_PUSH_LEVEL`, default INFO), so a quiet console still pushes INFO. The
/// layer is inert until `gateway::logpush::start`.
pub fn init_with_push(level: &str, format: LogFormat) {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::prelude::*;
    let filter = console_filter(level);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let push = crate::gateway::logpush::PushLayer.with_filter(LevelFilter::from_level(
        crate::gateway::logpush::push_level_from_env(),
    ));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(push);
    let _ = match format {
        LogFormat::Human => registry
            .with(fmt.with_target(false).with_filter(filter))
            .try_init(),
        LogFormat::Json => registry.with(fmt.json().with_filter(filter)).try_init(),
    };
}
