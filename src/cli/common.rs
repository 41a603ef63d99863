//! What the definitions of every subcommand share: the version string, the exit code of a
//! usage error, the help headings, and how a parse ends (help, `--version`, a usage error).

use std::ffi::OsString;
use std::process::ExitCode;

/// The default of `--uid-range`: above systemd's container range, below 2^31 (README).
pub const DEFAULT_UID_RANGE: &str = "1900000000-1900000999";

/// What `--version` prints after the program name: the version, the commit and the build
/// profile (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OSB_GIT_COMMIT"),
    ", ",
    env!("OSB_BUILD_PROFILE"),
    " build)"
);

/// The exit code of every usage error and every failure of the sandbox itself (docker's
/// convention), so that a script can tell them from a command's own exit codes.
pub const USAGE_EXIT: u8 = crate::exit::Exit::Ours.code();

// The help headings of `run` (and of the policy flags that `check` and `serve` share).
pub(super) const ISOLATION: &str = "Isolation";
pub(super) const LIMITS: &str = "Limits";
pub(super) const OUTPUT: &str = "Output";
pub(super) const IDENTITY: &str = "Identity and environment";
pub(super) const REPORTING: &str = "Reporting";

/// The parsed flags, or the exit code to return at once, after clap's own output: help and
/// `--version` on stdout with exit 0, a usage error on stderr with [`USAGE_EXIT`] (as a JSON
/// line when `--log-format json` is among the flags, so that stderr stays machine-readable).
/// Only before anything runs.
pub fn parsed<T>(r: Result<T, clap::Error>, argv: &[OsString]) -> Result<T, ExitCode> {
    match r {
        Ok(a) => Ok(a),
        Err(e) if !e.use_stderr() => {
            // A closed pipe (`--help | head`) is no error of ours.
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            if json_requested(argv) {
                let text = e.render().to_string();
                crate::logging::json_line("ERROR", text.trim(), None);
            } else {
                let _ = e.print();
            }
            Err(ExitCode::from(USAGE_EXIT))
        }
    }
}

/// `--log-format json` (or `=json`) among the flags, before `--`.
pub(super) fn json_requested(argv: &[OsString]) -> bool {
    let flags: Vec<&str> = argv
        .iter()
        .map_while(|a| a.to_str().filter(|a| *a != "--"))
        .collect();
    flags.windows(2).any(|w| w == ["--log-format", "json"]) || flags.contains(&"--log-format=json")
}
