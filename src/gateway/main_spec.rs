//! The main process's spec: where it comes from (trailing words > OPENSHELL_MAIN_PROCESS_SPEC >
//! OPENSHELL_SANDBOX_COMMAND), parsed and checked. Plain data: `config` holds it, and
//! `main_process` runs it.

use std::ffi::OsString;

use base64::Engine;

/// A spec larger than this is not a command line anyone meant.
const MAX_SPEC: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MainProcess {
    pub argv: Vec<OsString>,
    /// Asked for by the spec: run on a pty (attach with the `openshell-main` subsystem).
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
