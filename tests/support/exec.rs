//! ExecSandbox as the real gateway does it: validate, open the relay, build the
//! command string with its quoting, then drive a russh client over the relay: `none` auth as
//! `sandbox`, optional `pty-req` 0x0, `exec` with want_reply, stdin then `eof`, map
//! data/extended-data/exit-status, wait at most 500 ms after exit-status, 124 on timeout,
//! UNAVAILABLE when no exit status came.

use std::sync::Arc;
use std::time::Duration;

use openshell_sandbox::proto::v1::*;
use russh::ChannelMsg;
use russh::client;
use tokio::sync::mpsc;
use tonic::Status;

use super::gateway::{State, bridge};

const MAX_ARG: usize = 32 * 1024;
const MAX_COMMAND: usize = 256 * 1024;

/// Single-quote a value the way the gateway does.
pub fn shell_escape(v: &str) -> Result<String, Status> {
    if v.contains('\0') {
        return Err(Status::invalid_argument("value contains NUL"));
    }
    if v.is_empty() {
        return Ok("''".into());
    }
    if v.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'/' | b'_' | b'-'))
    {
        return Ok(v.into());
    }
    Ok(format!("'{}'", v.replace('\'', "'\"'\"'")))
}

/// `cd <workdir> && K=V ... argv...`, env sorted by key.
pub fn build_command(req: &ExecSandboxRequest) -> Result<String, Status> {
    let mut parts = Vec::new();
    let mut env: Vec<_> = req.environment.iter().collect();
    env.sort();
    for (k, v) in env {
        parts.push(format!("{k}={}", shell_escape(v)?));
    }
    for a in &req.command {
        parts.push(shell_escape(a)?);
    }
    let mut cmd = parts.join(" ");
    if !req.workdir.is_empty() {
        cmd = format!("cd {} && {cmd}", shell_escape(&req.workdir)?);
    }
    if cmd.len() > MAX_COMMAND {
        return Err(Status::invalid_argument("command exceeds 256 KiB"));
    }
    Ok(cmd)
}

fn validate(req: &ExecSandboxRequest) -> Result<(), Status> {
    let bad = |m: &str| Err(Status::invalid_argument(m.to_string()));
    if req.sandbox_id.is_empty() {
        return bad("sandbox_id is required");
    }
    if req.command.is_empty() {
        return bad("command is required");
    }
    if req.command.len() > 1024 {
        return bad("too many arguments");
    }
    for a in &req.command {
        if a.len() > MAX_ARG || a.contains('\0') {
            return bad("argument too long or contains NUL");
        }
    }
    for (k, v) in &req.environment {
        let key_ok =
            k.bytes().enumerate().all(|(i, b)| {
                b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
            }) && !k.is_empty();
        if !key_ok || (k.starts_with("OPENSHELL_") && k != "OPENSHELL_PYFUNC_B64") {
            return bad("invalid environment key");
        }
        if v.len() > MAX_ARG || v.contains(['\0', '\r', '\n']) {
            return bad("invalid environment value");
        }
    }
    if req.workdir.len() > 4096 || req.workdir.contains(['\0', '\r', '\n']) {
        return bad("invalid workdir");
    }
    Ok(())
}

/// Accepts any host key, as the gateway does.
pub struct AnyKey;

impl client::Handler for AnyKey {
    type Error = russh::Error;
    async fn check_server_key(
        &mut self,
        _key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// The russh client configuration the gateway uses: keepalive after 15 s of silence, dropped
/// after more than 4 unanswered.
pub fn client_config() -> Arc<client::Config> {
    Arc::new(client::Config {
        keepalive_interval: Some(Duration::from_secs(15)),
        keepalive_max: 4,
        nodelay: true,
        ..Default::default()
    })
}

/// Connect and authenticate over a relay duplex.
pub async fn ssh_connect(
    stream: tokio::io::DuplexStream,
) -> Result<client::Handle<AnyKey>, Status> {
    let mut h = client::connect_stream(client_config(), stream, AnyKey)
        .await
        .map_err(|e| Status::internal(format!("failed to establish ssh transport: {e}")))?;
    let auth = h
        .authenticate_none("sandbox")
        .await
        .map_err(|e| Status::internal(format!("failed to establish ssh transport: {e}")))?;
    if !auth.success() {
        return Err(Status::permission_denied(
            "ssh authentication rejected by sandbox",
        ));
    }
    Ok(h)
}

/// Run ExecSandbox; events go to the returned receiver, ending with `Exit` or an error status.
pub async fn exec_stream(
    st: Arc<State>,
    req: ExecSandboxRequest,
) -> Result<mpsc::Receiver<Result<ExecSandboxEvent, Status>>, Status> {
    validate(&req)?;
    if req.sandbox_id != st.sandbox_id {
        return Err(Status::not_found("sandbox not found"));
    }
    if !st.is_ready() {
        return Err(Status::failed_precondition("sandbox is not ready"));
    }
    let relay = st
        .open_relay(Some(relay_open::Target::Ssh(SshRelayTarget {})))
        .await?;
    let command = build_command(&req)?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let duplex = bridge(relay);
        let run = run_ssh(duplex, &req, command, tx.clone());
        let result = if req.timeout_seconds > 0 {
            match tokio::time::timeout(Duration::from_secs(u64::from(req.timeout_seconds)), run)
                .await
            {
                Ok(r) => r,
                // No signal is sent to the remote process; the connection is simply dropped.
                Err(_) => Ok(124),
            }
        } else {
            run.await
        };
        let last = result.map(|code| ExecSandboxEvent {
            payload: Some(exec_sandbox_event::Payload::Exit(ExecSandboxExit {
                exit_code: code,
            })),
        });
        let _ = tx.send(last).await;
    });
    Ok(rx)
}

async fn run_ssh(
    duplex: tokio::io::DuplexStream,
    req: &ExecSandboxRequest,
    command: String,
    tx: mpsc::Sender<Result<ExecSandboxEvent, Status>>,
) -> Result<i32, Status> {
    let h = ssh_connect(duplex).await?;
    let mut ch = h
        .channel_open_session()
        .await
        .map_err(|e| Status::internal(format!("failed to open ssh channel: {e}")))?;
    if req.tty {
        ch.request_pty(false, "xterm-256color", 0, 0, 0, 0, &[])
            .await
            .map_err(|e| Status::internal(format!("failed to allocate PTY: {e}")))?;
    }
    if req.no_login_shell {
        ch.set_env(false, "OPENSHELL_NO_LOGIN_SHELL", "1")
            .await
            .map_err(|e| Status::internal(format!("failed to set env: {e}")))?;
    }
    ch.exec(true, command.into_bytes())
        .await
        .map_err(|e| Status::internal(format!("failed to exec: {e}")))?;
    if !req.stdin.is_empty() {
        ch.data(&req.stdin[..])
            .await
            .map_err(|e| Status::internal(format!("failed to send stdin: {e}")))?;
    }
    ch.eof()
        .await
        .map_err(|e| Status::internal(format!("failed to send eof: {e}")))?;
    let mut code: Option<i32> = None;
    loop {
        let msg = match code {
            Some(_) => match tokio::time::timeout(Duration::from_millis(500), ch.wait()).await {
                Ok(m) => m,
                Err(_) => break,
            },
            None => ch.wait().await,
        };
        let ev = match msg {
            None | Some(ChannelMsg::Close) => break,
            Some(ChannelMsg::Data { data }) => {
                exec_sandbox_event::Payload::Stdout(ExecSandboxStdout { data })
            }
            Some(ChannelMsg::ExtendedData { data, .. }) => {
                exec_sandbox_event::Payload::Stderr(ExecSandboxStderr { data })
            }
            Some(ChannelMsg::ExitStatus { exit_status }) => {
                code = Some(i32::try_from(exit_status).unwrap_or(i32::MAX));
                continue;
            }
            Some(_) => continue,
        };
        if tx
            .send(Ok(ExecSandboxEvent { payload: Some(ev) }))
            .await
            .is_err()
        {
            break;
        }
    }
    let _ = ch.close().await;
    let _ = h
        .disconnect(russh::Disconnect::ByApplication, "exec complete", "en")
        .await;
    code.ok_or_else(|| {
        Status::unavailable("exec relay closed before the command reported an exit status")
    })
}

/// What one exec produced.
#[derive(Debug, Default)]
pub struct ExecResult {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: Option<i32>,
    pub status: Option<Status>,
}

impl ExecResult {
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Run an exec and feed each event to `f`; returns the exit code or the error status.
pub async fn exec_each(
    st: Arc<State>,
    req: ExecSandboxRequest,
    mut f: impl FnMut(&exec_sandbox_event::Payload),
) -> Result<i32, Status> {
    let mut rx = exec_stream(st, req).await?;
    while let Some(ev) = rx.recv().await {
        match ev?.payload {
            Some(exec_sandbox_event::Payload::Exit(e)) => return Ok(e.exit_code),
            Some(p) => f(&p),
            None => {}
        }
    }
    Err(Status::internal("exec stream ended without an exit"))
}

/// Run an exec and collect everything.
pub async fn exec_collect(st: Arc<State>, req: ExecSandboxRequest) -> ExecResult {
    let mut r = ExecResult::default();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let res = exec_each(st, req, |p| match p {
        exec_sandbox_event::Payload::Stdout(d) => out.extend_from_slice(&d.data),
        exec_sandbox_event::Payload::Stderr(d) => err.extend_from_slice(&d.data),
        _ => {}
    })
    .await;
    r.stdout = out;
    r.stderr = err;
    match res {
        Ok(c) => r.exit = Some(c),
        Err(s) => r.status = Some(s),
    }
    r
}
