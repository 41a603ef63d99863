//! The command's environment in `run`: a minimal base, `--inherit-env`, `--env`; never the
//! supervisor's own variables nor a credential's value.

use std::ffi::OsString;
use std::path::Path;

use crate::cli::RunArgs;
use crate::exec::RunError;

/// Variables that must never reach the child through `--env` or `--inherit-env`.
fn is_supervisor_secret(name: &str) -> bool {
    name.starts_with("OPENSHELL_") || name == "RUST_LOG"
}

/// The child's environment: a minimal base, then `--inherit-env`, then `--env`.
pub(super) fn child_env(
    args: &RunArgs,
    home: &Path,
    tmpdir: Option<&Path>,
) -> Result<Vec<(OsString, OsString)>, RunError> {
    let mut env: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), home.as_os_str().to_owned()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    if let Some(t) = tmpdir {
        env.push(("TMPDIR".into(), t.as_os_str().to_owned()));
    }
    let mut set = |k: OsString, v: OsString| {
        env.retain(|(ek, _)| *ek != k);
        env.push((k, v));
    };
    for name in &args.inherit_env {
        if is_supervisor_secret(name) {
            return Err(RunError::Usage(format!(
                "--inherit-env {name}: supervisor variables never reach the sandbox"
            )));
        }
        // A credential's value stays with the proxy; inheriting it would put it in the
        // command's environment (and, meanwhile, in our heap) next to its placeholder.
        if args
            .credential
            .iter()
            .any(|c| c.split_once('@').map_or(c.as_str(), |(n, _)| n) == name)
        {
            return Err(RunError::Usage(format!(
                "--inherit-env {name}: {name} is a --credential, whose value never enters the sandbox (the command gets its placeholder); drop --inherit-env {name}"
            )));
        }
        if let Some(v) = std::env::var_os(name) {
            set(name.into(), v);
        }
    }
    for (k, v) in &args.env {
        if is_supervisor_secret(k) {
            return Err(RunError::Usage(format!(
                "--env {k}: supervisor variables never reach the sandbox"
            )));
        }
        set(k.into(), v.into());
    }
    Ok(env)
}
