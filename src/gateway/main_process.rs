//! The optional canonical main process: where it comes from (trailing words >
//! OPENSHELL_MAIN_PROCESS_SPEC > OPENSHELL_SANDBOX_COMMAND), and reporting its exit to the
//! gateway (sheet §6: retried with backoff until the gateway says OK).

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use tonic::Code;

use super::auth::{self, TokenStore};
use super::channel;
use super::config::GatewayConfig;
use crate::proto::v1::ReportMainProcessExitRequest;

/// A spec larger than this is not a command line anyone meant.
const MAX_SPEC: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MainProcess {
    pub argv: Vec<OsString>,
    /// Asked for by the spec. There is no attach subsystem here, so it runs without a pty.
    pub tty: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("OPENSHELL_MAIN_PROCESS_SPEC: {0}")]
    Spec(String),
    #[error("OPENSHELL_SANDBOX_COMMAND is set but holds no command words")]
    EmptySandboxCommand,
    #[error("{0}: a command word contains a NUL byte")]
    Nul(&'static str),
}

#[derive(serde::Deserialize)]
struct Spec {
    version: u32,
    command: Vec<String>,
    #[serde(default)]
    tty: bool,
}

impl MainProcess {
    pub fn from_sources(
        words: &[OsString],
        spec: Option<&str>,
        sandbox_command: Option<&str>,
    ) -> Result<Option<MainProcess>, SpecError> {
        if !words.is_empty() {
            if words.iter().any(|w| w.as_encoded_bytes().contains(&0)) {
                return Err(SpecError::Nul("main process command"));
            }
            return Ok(Some(MainProcess {
                argv: words.to_vec(),
                tty: false,
            }));
        }
        if let Some(s) = spec.map(str::trim).filter(|s| !s.is_empty()) {
            return parse_spec(s).map(Some);
        }
        if let Some(c) = sandbox_command {
            let argv: Vec<OsString> = c.split_whitespace().map(OsString::from).collect();
            if argv.is_empty() {
                return Err(SpecError::EmptySandboxCommand);
            }
            if c.contains('\0') {
                return Err(SpecError::Nul("OPENSHELL_SANDBOX_COMMAND"));
            }
            return Ok(Some(MainProcess { argv, tty: false }));
        }
        Ok(None)
    }
}

/// `{"version":1,"command":[...],"tty":bool}` or `base64url:` + URL-safe unpadded base64 of it.
pub fn parse_spec(s: &str) -> Result<MainProcess, SpecError> {
    let bad = |m: String| SpecError::Spec(m);
    if s.len() > MAX_SPEC {
        return Err(bad(format!(
            "{} bytes is over the {MAX_SPEC}-byte limit",
            s.len()
        )));
    }
    let json: Vec<u8> = match s.strip_prefix("base64url:") {
        Some(b64) => base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(b64.trim().trim_end_matches('='))
            .map_err(|e| bad(format!("the base64url payload does not decode: {e}")))?,
        None => s.as_bytes().to_vec(),
    };
    let spec: Spec = serde_json::from_slice(&json)
        .map_err(|e| bad(format!("not the expected JSON object: {e}")))?;
    if spec.version != 1 {
        return Err(bad(format!(
            "version {} is not supported (only 1)",
            spec.version
        )));
    }
    match spec.command.first() {
        None => return Err(bad("`command` is empty".into())),
        Some(c) if c.is_empty() => return Err(bad("`command[0]` is empty".into())),
        Some(_) => {}
    }
    if spec.command.iter().any(|w| w.contains('\0')) {
        return Err(SpecError::Nul("OPENSHELL_MAIN_PROCESS_SPEC"));
    }
    Ok(MainProcess {
        argv: spec.command.into_iter().map(OsString::from).collect(),
        tty: spec.tty,
    })
}

/// Report the main process's exit (sheet §6): a new channel per attempt, backoff 250 ms
/// doubling to 2 s, until the gateway answers OK. A gateway older than v0.0.111 has no such
/// method; that is logged and the report is dropped.
pub async fn report_exit(
    cfg: &GatewayConfig,
    tokens: &Arc<TokenStore>,
    instance_id: &str,
    exit_code: i32,
) {
    let mut delay = Duration::from_millis(250);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match report_once(cfg, tokens, instance_id, exit_code).await {
            Ok(()) => {
                tracing::info!(
                    exit_code,
                    attempt,
                    "main process exit reported to the gateway"
                );
                return;
            }
            Err(ReportError::Status(s)) if s.code() == Code::Unimplemented => {
                tracing::warn!(
                    "the gateway has no ReportMainProcessExit (it predates v0.0.111); exit {exit_code} not reported"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(
                    attempt,
                    "reporting the main process exit failed, retrying in {delay:?}: {e}"
                )
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

#[derive(Debug, thiserror::Error)]
enum ReportError {
    #[error(transparent)]
    Connect(#[from] channel::ConnectError),
    #[error(transparent)]
    Token(#[from] auth::TokenError),
    #[error("ReportMainProcessExit: {0}")]
    Status(tonic::Status),
}

async fn report_once(
    cfg: &GatewayConfig,
    tokens: &Arc<TokenStore>,
    instance_id: &str,
    exit_code: i32,
) -> Result<(), ReportError> {
    let ch = channel::connect(cfg).await?;
    auth::ensure_token(tokens, &ch).await?;
    let mut client = channel::client(ch, tokens);
    client
        .report_main_process_exit(ReportMainProcessExitRequest {
            sandbox_id: cfg.sandbox_id.clone(),
            instance_id: instance_id.to_owned(),
            exit_code,
        })
        .await
        .map_err(ReportError::Status)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_json_and_base64url() {
        let json = r#"{"version":1,"command":["sleep","infinity"],"tty":true}"#;
        let m = parse_spec(json).unwrap();
        assert_eq!(
            m.argv,
            vec![OsString::from("sleep"), OsString::from("infinity")]
        );
        assert!(m.tty);
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        assert_eq!(parse_spec(&format!("base64url:{b}")).unwrap(), m);
    }

    #[test]
    fn bad_specs_say_why() {
        let e = |s: &str| parse_spec(s).unwrap_err().to_string();
        assert!(e(r#"{"version":2,"command":["x"]}"#).contains("version 2"));
        assert!(e(r#"{"version":1,"command":[]}"#).contains("empty"));
        assert!(e(r#"{"version":1,"command":[""]}"#).contains("command[0]"));
        assert!(e("base64url:!!!").contains("base64url"));
        assert!(e("nope").contains("JSON"));
        assert!(e("nope").contains("OPENSHELL_MAIN_PROCESS_SPEC"));
    }

    #[test]
    fn precedence_words_then_spec_then_sandbox_command() {
        let spec = r#"{"version":1,"command":["from-spec"]}"#;
        let words = vec![OsString::from("from-words")];
        let pick = |w: &[OsString], s, c| MainProcess::from_sources(w, s, c).unwrap().unwrap().argv;
        assert_eq!(pick(&words, Some(spec), Some("a b")), words);
        assert_eq!(
            pick(&[], Some(spec), Some("a b")),
            vec![OsString::from("from-spec")]
        );
        assert_eq!(pick(&[], None, Some("sleep  infinity")).len(), 2);
        assert_eq!(MainProcess::from_sources(&[], None, None).unwrap(), None);
        assert!(MainProcess::from_sources(&[], None, Some("  ")).is_err());
    }
}
