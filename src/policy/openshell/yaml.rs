//! The YAML source: OpenShell's sandbox-policy file format.
//!
//! serde-saphyr is a pure-Rust YAML parser that promises panic-free parsing and bounds alias
//! expansion (a "billion laughs" document is an error, not an allocation storm). Unknown keys
//! are refused by `deny_unknown_fields` on every model type; duplicate keys are refused too
//! (the parser's default), since two spellings of one key would leave the winner to chance.

use super::model::SandboxPolicy;

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// Syntax, an unknown or duplicate key, a missing `version`, a wrong type. The parser's
    /// message names the key and the line.
    #[error("policy YAML: {0}")]
    Parse(#[source] Box<serde_saphyr::Error>),
    #[error("policy YAML: {key}: `port` and `ports` are exclusive; give one")]
    PortAndPorts { key: String },
    #[error("policy YAML: cannot read the file: {0}")]
    Read(#[source] std::io::Error),
    #[error("policy YAML: cannot write: {0}")]
    Serialize(#[source] Box<serde_saphyr::SerializeError>),
}

/// Decode OpenShell's policy YAML.
pub fn from_yaml(text: &str) -> Result<SandboxPolicy, YamlError> {
    // YAML 1.1 also reads `yes`, `on`, `y` as booleans; OpenShell's parser does not, and a
    // string that silently became `true` (include_workdir: "on") is the kind of surprise a
    // policy must not have.
    // No snippet: its header names a source (`<input>`) that is not the file, and repeats the
    // message under a caret; the caller names the file once, the message names the line.
    let options = serde_saphyr::options! { strict_booleans: true, with_snippet: false };
    let policy: SandboxPolicy = serde_saphyr::from_str_with_options(text, options)
        .map_err(|e| YamlError::Parse(Box::new(e)))?;
    for (key, rule) in &policy.network_policies {
        for (i, ep) in rule.endpoints.iter().enumerate() {
            if ep.port != 0 && !ep.ports.is_empty() {
                return Err(YamlError::PortAndPorts {
                    key: format!("network_policies.{key}.endpoints[{i}]"),
                });
            }
        }
    }
    Ok(policy)
}

/// Encode the model as policy YAML (what `policy get` prints). The opaque L7 keys and
/// `network_middlewares` are not written: the model does not hold their values.
pub fn to_yaml(policy: &SandboxPolicy) -> Result<String, YamlError> {
    serde_saphyr::to_string(policy).map_err(|e| YamlError::Serialize(Box::new(e)))
}
