//! The relay's own answers, as hyper responses: the JSON errors of `egress::response`, and the
//! L7 deny with its `X-OpenShell-Policy` header and OpenShell's body.

use bytes::Bytes;
use http::Response;
use http::header;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;

use super::super::identity::Caller;
use super::super::request::HostPort;
use crate::policy::network::Protocol;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(b: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(b.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A prebuilt response (`response::json` and friends) as a hyper response.
pub fn from_raw(raw: &[u8]) -> Response<Body> {
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(raw.len(), |i| i + 4);
    let code: u16 = std::str::from_utf8(&raw[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close")
        .body(full(Bytes::copy_from_slice(&raw[at..])))
        .expect("static response")
}

/// What an L7 deny names.
pub struct Denied<'a> {
    pub dest: &'a HostPort,
    pub caller: &'a Caller,
    pub protocol: Protocol,
    pub rule: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub reason: &'a str,
}

/// The L7 deny: 403 `policy_denied` with `X-OpenShell-Policy: <rule key>` and OpenShell's
/// body; the tunnel closes after it.
pub fn l7_deny(d: &Denied<'_>) -> Response<Body> {
    let host = d.dest.policy_host();
    let (rule, method, path) = (d.rule, d.method, d.path);
    let body = serde_json::json!({
        "error": "policy_denied",
        "policy": rule,
        "rule": format!("{method} {path}"),
        "detail": d.reason,
        "layer": "l7",
        "protocol": d.protocol.as_str(),
        "method": method,
        "path": path,
        "host": host,
        "port": d.dest.port,
        "binary": d.caller.exe,
        "rule_missing": {
            "type": "rest_allow",
            "layer": "l7",
            "method": method,
            "path": path,
            "host": host,
            "port": d.dest.port,
            "binary": d.caller.exe,
        },
        "next_steps": [
            format!("add an allow rule for {method} {path} to policy '{rule}', or remove the deny rule that matches it"),
        ],
    });
    Response::builder()
        .status(403)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close")
        .header("X-OpenShell-Policy", rule)
        .body(full(body.to_string()))
        .expect("static response")
}
