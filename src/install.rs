//! Placeholder: implemented on its own branch and merged.
use std::ffi::OsString;
use std::process::ExitCode;

pub fn main(_argv: &[OsString]) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`install` is not built yet")
}

pub fn copy_self_main(_argv: &[OsString]) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`copy-self` is not built yet")
}
