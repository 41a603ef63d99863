//! The steps that read no network: the configuration as `serve` resolves it, and the main
//! process it would start.

use std::path::{Path, PathBuf};

use super::step::Step;
use crate::gateway::config::{ALLOW_PLAINTEXT_TOKEN, ConfigError, GatewayConfig, ServeArgs};
use crate::gateway::exec_service::DEFAULT_PATH;
use crate::gateway::main_spec::MainProcess;

/// Problems `ServeArgs::resolve` stops at that belong to a later step: they are taken out, the
/// configuration is resolved again, and the step reports them in its turn, so the steps before
/// it still run.
#[derive(Default)]
pub(super) struct Early {
    pub(super) tls: Option<Step>,
    pub(super) token: Option<Step>,
    pub(super) main: Option<Step>,
}

pub(super) fn resolve(serve: &mut ServeArgs) -> (Result<GatewayConfig, Step>, Early) {
    let mut early = Early::default();
    // Each pass removes one cause; four causes at most, so this ends.
    for _ in 0..5 {
        match serve.resolve() {
            Ok(cfg) => {
                let gw = cfg.gateway.ok_or_else(|| {
                    Step::failed(
                        "endpoint",
                        "endpoint-missing",
                        "OPENSHELL_ENDPOINT (and OPENSHELL_GATEWAY_ENDPOINT, --endpoint) is not set: with --no-gateway serve runs the main process only and never dials the gateway, so the sandbox never becomes READY",
                        "set OPENSHELL_ENDPOINT to the gateway Service URL, e.g. https://openshell.openshell.svc.cluster.local:8080 (the gateway's OPENSHELL_GRPC_ENDPOINT)",
                    )
                });
                return (gw, early);
            }
            Err(ConfigError::PlaintextToken(var, ep)) => {
                early.token = Some(Step::failed(
                    "token",
                    "plaintext-token",
                    format!(
                        "serve refuses to send the bearer token ({var}) over the plaintext endpoint {ep}, which is not loopback: whoever can see the traffic can copy the token and act as this sandbox's supervisor"
                    ),
                    format!(
                        "use an https:// endpoint with the client TLS Secret mounted, or a loopback endpoint; on a network you trust, accept the risk with {ALLOW_PLAINTEXT_TOKEN}=1"
                    ),
                ));
                serve.allow_plaintext_token = true;
            }
            Err(e @ ConfigError::LoopbackTokenSharedNetwork(..)) => {
                early.token = Some(Step::failed(
                    "token",
                    "plaintext-token-shared-network",
                    e.to_string(),
                    format!(
                        "use https://, or run without --network all; or accept the risk with {ALLOW_PLAINTEXT_TOKEN}=1"
                    ),
                ));
                serve.allow_plaintext_token = true;
            }
            Err(ConfigError::EmptyToken) => {
                early.token = Some(Step::failed(
                    "token",
                    "token-empty",
                    "OPENSHELL_SANDBOX_TOKEN is set but empty",
                    "unset OPENSHELL_SANDBOX_TOKEN, or give it the gateway JWT",
                ));
                serve.sandbox_token = None;
            }
            Err(ConfigError::BadServerName(name)) => {
                early.tls = Some(Step::failed(
                    "tls",
                    "bad-server-name",
                    format!(
                        "OPENSHELL_GATEWAY_TLS_SERVER_NAME `{name}` is not a DNS name or IP address"
                    ),
                    "set it to a name in the gateway certificate's subjectAltName, or unset it to use the endpoint host",
                ));
                serve.tls_server_name = None;
            }
            Err(e @ ConfigError::MainProcess(_)) => {
                early.main = Some(Step::failed(
                    "main-process",
                    "main-process-spec",
                    format!("{e}: serve exits 125 at start, before dialing"),
                    "fix the sandbox spec's command (OPENSHELL_MAIN_PROCESS_SPEC must be {\"version\":1,\"command\":[...],\"tty\":bool})",
                ));
                serve.command.clear();
                serve.main_process_spec = None;
                serve.sandbox_command = None;
            }
            Err(e) => return (Err(config_failure(e)), early),
        }
    }
    unreachable_config()
}

pub(super) fn unreachable_config() -> (Result<GatewayConfig, Step>, Early) {
    (
        Err(Step::failed(
            "endpoint",
            "config",
            "the configuration could not be resolved",
            "run `openshell-sandbox serve` with the same env to see the error",
        )),
        Early::default(),
    )
}

pub(super) fn config_failure(e: ConfigError) -> Step {
    match e {
        ConfigError::MissingSandboxId => Step::failed(
            "endpoint",
            "sandbox-id-missing",
            e.to_string(),
            "the pod's OPENSHELL_SANDBOX_ID comes from the gateway's driver; set it to the sandbox's UUID",
        ),
        ConfigError::BadEndpoint { .. } => Step::failed(
            "endpoint",
            "endpoint-invalid",
            e.to_string(),
            "OPENSHELL_ENDPOINT must be https://HOST:PORT (mTLS) or http://HOST:PORT (plaintext), no path",
        ),
        ConfigError::NothingToDo | ConfigError::NoGateway { .. } => Step::failed(
            "endpoint",
            "endpoint-missing",
            e.to_string(),
            "set OPENSHELL_ENDPOINT to the gateway Service URL, e.g. https://openshell.openshell.svc.cluster.local:8080",
        ),
        other => Step::failed(
            "endpoint",
            "config",
            other.to_string(),
            "fix the flag or variable named",
        ),
    }
}

/// The canonical main process serve would start: a spec it cannot parse, or a program that is
/// not there, ends the sandbox at once (the gateway marks it ERROR, `MainProcessExited`).
pub(super) fn main_process_step(serve: &ServeArgs, early: Option<Step>) -> Step {
    if let Some(s) = early {
        return s;
    }
    let main = match MainProcess::from_sources(
        &serve.command,
        serve.main_process_spec.as_deref(),
        serve.sandbox_command.as_deref(),
    ) {
        Ok(m) => m,
        Err(e) => {
            return Step::failed(
                "main-process",
                "main-process-spec",
                e.to_string(),
                "fix the sandbox spec's command",
            );
        }
    };
    let Some(main) = main else {
        return Step::ok(
            "main-process",
            "none configured (no OPENSHELL_MAIN_PROCESS_SPEC, OPENSHELL_SANDBOX_COMMAND or command words)",
        );
    };
    let argv: Vec<String> = main
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let prog = &argv[0];
    let path = std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.into());
    let shown = format!("{argv:?} (tty {})", main.tty);
    match find_program(prog, &path) {
        Ok(p) => Step::ok("main-process", format!("{shown}: {}", p.display())),
        Err(why) => Step::failed(
            "main-process",
            "main-process-not-runnable",
            format!(
                "{shown}: `{prog}` {why}: the main process cannot start, so the supervisor exits at once and the sandbox never becomes READY (or, once READY, is marked ERROR: MainProcessExited)"
            ),
            "give the sandbox a command that exists in the image and keeps running (exit 0 is terminal too), e.g. `sleep infinity`",
        ),
    }
}

/// Where `prog` resolves: a path is taken as is, a bare name searched in `path`.
pub(super) fn find_program(prog: &str, path: &str) -> Result<PathBuf, &'static str> {
    let candidates: Vec<PathBuf> = if prog.contains('/') {
        vec![PathBuf::from(prog)]
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(prog))
            .collect()
    };
    let mut found_not_exec = false;
    for c in candidates {
        let Ok(meta) = std::fs::metadata(&c) else {
            continue;
        };
        use std::os::unix::fs::PermissionsExt;
        if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
            return Ok(c);
        }
        found_not_exec = true;
    }
    Err(if found_not_exec {
        "is not an executable file"
    } else if prog.contains('/') {
        "does not exist"
    } else {
        "is not found on PATH"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_resolve_like_the_spawn() {
        assert!(find_program("sh", DEFAULT_PATH).is_ok());
        assert_eq!(
            find_program("/nonexistent/x", DEFAULT_PATH).unwrap_err(),
            "does not exist"
        );
        assert_eq!(
            find_program("no-such-program-xyz", DEFAULT_PATH).unwrap_err(),
            "is not found on PATH"
        );
        let plain = std::env::temp_dir().join(format!("osb-doctor-{}", std::process::id()));
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        let res = find_program(plain.to_str().unwrap(), DEFAULT_PATH);
        std::fs::remove_file(&plain).unwrap();
        assert_eq!(res.unwrap_err(), "is not an executable file");
    }
}
