//! The proxy's own answers: OpenShell's status codes and JSON bodies, each followed by a close.
//! A body is `{"error": …, "detail": …}` plus `reason` where there is one.

use super::request::HeadError;

/// `HTTP/1.1 200 Connection Established`, with no headers: what a CONNECT client waits for.
pub const CONNECT_OK: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

fn status_text(code: u16) -> &'static str {
    match code {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A complete response with a body of `content_type` (no body when empty).
pub fn raw(code: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {code} {}\r\n", status_text(code));
    if !body.is_empty() {
        out.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut v = out.into_bytes();
    v.extend_from_slice(body);
    v
}

/// A JSON error response.
pub fn json(code: u16, error: &str, detail: &str, reason: Option<&str>) -> Vec<u8> {
    let mut body = serde_json::Map::new();
    body.insert("error".into(), error.into());
    body.insert("detail".into(), detail.into());
    if let Some(r) = reason {
        body.insert("reason".into(), r.into());
    }
    let body = serde_json::Value::Object(body).to_string();
    raw(code, "application/json", body.as_bytes())
}

/// 403 `policy_denied`.
pub fn policy_denied(detail: &str, reason: &str) -> Vec<u8> {
    json(403, "policy_denied", detail, Some(reason))
}

/// 403 `ssrf_denied` (no reason: the kind is in the detail).
pub fn ssrf_denied(detail: &str) -> Vec<u8> {
    json(403, "ssrf_denied", detail, None)
}

/// 502 `upstream_unreachable` (forwarding only: a CONNECT whose dial fails is closed
/// without a response, as OpenShell does).
pub fn upstream_unreachable(host_port: &str) -> Vec<u8> {
    json(
        502,
        "upstream_unreachable",
        &format!("connection to {host_port} failed"),
        None,
    )
}

/// 503 `connection_limit`: the proxy's cap on open connections, per sandbox or per exec.
pub fn connection_limit(detail: &str) -> Vec<u8> {
    json(503, "connection_limit", detail, None)
}

/// The answer to a refused head.
pub fn for_head_error(e: &HeadError) -> Vec<u8> {
    match e {
        HeadError::TooLarge => raw(431, "", b""),
        HeadError::Malformed(_) => raw(400, "", b""),
        HeadError::HttpsUrl => raw(400, "text/plain", b"Use CONNECT for HTTPS URLs"),
        HeadError::Scheme(s) => json(
            400,
            "unsupported_proxy_scheme",
            &format!("scheme '{s}' is not supported; use http:// or CONNECT"),
            None,
        ),
        HeadError::ConnectTarget(t) => json(
            400,
            "invalid_connect_target",
            &format!("CONNECT target '{t}' is not host:port or [IPv6]:port"),
            None,
        ),
    }
}
