//! Placeholder: implemented on its own branch and merged.
use std::ffi::OsString;
use std::process::ExitCode;

pub fn main(_argv: &[OsString]) -> anyhow::Result<ExitCode> {
    anyhow::bail!("the supervisor (`serve`) is not built yet")
}
