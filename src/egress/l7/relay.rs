//! The inspecting HTTP relay: every request of a tunnel (plain, or inside the client's TLS
//! session) is parsed, canonicalised, checked against the tunnel's authority and the L7
//! rules, its placeholders replaced, and only then sent upstream. hyper carries both sides,
//! so keep-alive, chunked bodies and streaming responses pass without being buffered.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use super::super::credentials::{self, CredentialError, Credentials};
use super::super::decide::Settings;
use super::super::event::EventSink;
use super::super::identity::Caller;
use super::super::relay::{End, Guard};
use super::super::request::HostPort;
use super::super::response;
use super::super::revision::{PolicyState, Revision};
use super::body::ScanBody;
use super::event::{L7Decision, L7Event};
use super::path::{self, PathError};
use super::rules::{L7Scope, RequestView, Verdict};
use crate::policy::network::Protocol;

/// Header block of one request inside a relay.
pub const MAX_RELAY_HEAD: usize = 16 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// What one inspected tunnel's requests are checked against.
pub struct Tunnel {
    pub dest: HostPort,
    /// Inside TLS: the authority's default port is 443, else 80.
    pub tls: bool,
    pub caller: Caller,
    pub revision: Arc<Revision>,
    /// The endpoint settings the connection was admitted under (`None`: an L4 endpoint).
    pub settings: Option<Settings>,
    pub credentials: Arc<Credentials>,
    pub events: Arc<dyn EventSink>,
    pub head_timeout: Duration,
}

fn full(b: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(b.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A prebuilt response (`response::json` and friends) as a hyper response.
fn from_raw(raw: &[u8], extra: &[(&'static str, String)]) -> Response<Body> {
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(raw.len(), |i| i + 4);
    let code: u16 = std::str::from_utf8(&raw[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let mut b = Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close");
    for (k, v) in extra {
        b = b.header(*k, v.as_str());
    }
    b.body(full(Bytes::copy_from_slice(&raw[at..])))
        .expect("static response")
}

/// Why a request ended its tunnel without a response.
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("{0}")]
    Path(PathError),
    #[error("policy changed")]
    Stale,
}

/// Serve the tunnel's requests until either side ends or the guard fires.
pub async fn serve<C, U>(client: C, upstream: U, t: Tunnel, guard: &mut Guard) -> End
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handshake = hyper::client::conn::http1::Builder::new()
        .preserve_header_case(true)
        .max_buf_size(1024 * 1024)
        .handshake::<_, Body>(TokioIo::new(upstream))
        .await;
    let (sender, conn) = match handshake {
        Ok(x) => x,
        Err(e) => return End::Error(io::Error::other(e)),
    };
    // Drives the request and response bodies; it ends when the upstream closes.
    let driver = tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let t = Arc::new(t);
    let generation = guard.generation();
    let stale: Arc<dyn Fn() -> bool + Send + Sync> = Arc::new(guard.probe());
    let svc = {
        let t = t.clone();
        let stale = stale.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let t = t.clone();
            let sender = sender.clone();
            let stale = stale.clone();
            async move { handle(req, &t, &sender, &*stale, generation).await }
        })
    };
    let mut server = hyper::server::conn::http1::Builder::new();
    server
        .timer(TokioTimer::new())
        .header_read_timeout(t.head_timeout)
        .max_buf_size(MAX_RELAY_HEAD)
        .max_headers(128)
        .preserve_header_case(true);
    let conn = server
        .serve_connection(TokioIo::new(client), svc)
        .with_upgrades();
    let end = tokio::select! {
        r = conn => match r {
            Ok(()) => End::Done,
            Err(e) => End::Error(io::Error::other(e)),
        },
        e = guard.ended() => e,
    };
    driver.abort();
    end
}

fn authority_matches(host_header: &str, dest: &HostPort, tls: bool) -> bool {
    let default = if tls { 443 } else { 80 };
    let (h, p) = match host_header.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || host_header.starts_with('[') => {
            if h.contains(':') && !h.starts_with('[') {
                (host_header, None)
            } else {
                (h, Some(p))
            }
        }
        _ => (host_header, None),
    };
    let port = match p {
        Some(p) => match p.parse::<u16>() {
            Ok(p) => p,
            Err(_) => return false,
        },
        None => default,
    };
    let h = h.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case(&dest.host) && port == dest.port
}

async fn handle(
    mut req: Request<Incoming>,
    t: &Tunnel,
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Body>>,
    stale: &(dyn Fn() -> bool + Send + Sync),
    generation: u64,
) -> Result<Response<Body>, Closed> {
    let method = req.method().as_str().to_string();
    let dest = t.dest.display();
    let rules = match &t.revision.state {
        PolicyState::Rules(r) => Some(r),
        PolicyState::Quarantined { .. } => None,
    };
    let scope = match (rules, &t.settings) {
        (Some(r), Some(_)) => L7Scope::of(r, &t.dest.policy_host(), t.dest.port, &t.caller),
        _ => L7Scope::default(),
    };
    let raw_target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    // Absolute-form inside a tunnel has no single reading: refused like a bad path.
    let canon = if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        Err(PathError::NotOriginForm)
    } else {
        match path::canonicalize(&raw_target, false) {
            Err(PathError::EncodedSlash)
                if scope.endpoints.iter().any(|(_, e)| e.allow_encoded_slash) =>
            {
                path::canonicalize(&raw_target, true).and_then(|c| match scope.select(&c.path) {
                    Some((_, e)) if e.allow_encoded_slash => Ok(c),
                    _ => Err(PathError::EncodedSlash),
                })
            }
            r => r,
        }
    };
    let canon = match canon {
        Ok(c) => c,
        Err(e) => {
            t.emit(
                L7Decision::ParseRejected,
                &method,
                "-",
                &raw_target,
                Some(e.to_string()),
                generation,
            );
            return Err(Closed::Path(e));
        }
    };
    let host_ok = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| authority_matches(h, &t.dest, t.tls));
    if !host_ok {
        let detail = format!("request authority does not match the tunnel's {dest}");
        t.emit(
            L7Decision::Deny,
            &method,
            "-",
            &canon.path,
            Some(detail.clone()),
            generation,
        );
        return Ok(from_raw(
            &response::json(403, "request_authority_mismatch", &detail, None),
            &[],
        ));
    }
    if stale() {
        return Err(Closed::Stale);
    }
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    let mut rule = "-".to_string();
    if !scope.is_empty() {
        if upgrade.as_deref() == Some("h2c") {
            let detail =
                "HTTP/2 cleartext upgrade (h2c) is not supported for L7-inspected endpoints";
            t.emit(
                L7Decision::Deny,
                &method,
                "-",
                &canon.path,
                Some(detail.into()),
                generation,
            );
            return Ok(from_raw(
                &response::json(403, "policy_denied", detail, None),
                &[],
            ));
        }
        let query = path::query_params(canon.query.as_deref());
        let redacted = credentials::redact(&canon.path);
        let view = RequestView {
            method: &method,
            path: &redacted,
            query: &query,
        };
        match scope.evaluate(&view) {
            Verdict::Allow { rule: r } => {
                t.emit(L7Decision::Allow, &method, &r, &redacted, None, generation);
                rule = r;
            }
            Verdict::Audit { rule: r, reason } => {
                t.emit(
                    L7Decision::Audit,
                    &method,
                    &r,
                    &redacted,
                    Some(reason),
                    generation,
                );
                rule = r;
            }
            Verdict::Deny { rule: r, reason } => {
                t.emit(
                    L7Decision::Deny,
                    &method,
                    &r,
                    &redacted,
                    Some(reason.clone()),
                    generation,
                );
                let body = deny_body(t, &r, &method, &redacted, &reason);
                return Ok(Response::builder()
                    .status(403)
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(header::CONNECTION, "close")
                    .header("X-OpenShell-Policy", r.as_str())
                    .body(full(body.to_string()))
                    .expect("static response"));
            }
        }
    }
    // Placeholders, only now that the request is admitted.
    let host = t.dest.policy_host();
    let port = t.dest.port;
    let mut target = canon.target();
    let mut injected = false;
    let mut rewrite = || -> Result<(), CredentialError> {
        if let Some(n) = t.credentials.rewrite(&target, &host, port)? {
            target = n;
            injected = true;
        }
        let mut replaced = Vec::new();
        for (name, value) in req.headers() {
            let Ok(v) = value.to_str() else {
                if credentials::has_marker(value.as_bytes()) {
                    return Err(CredentialError::Unresolvable(name.to_string()));
                }
                continue;
            };
            if let Some(n) = t.credentials.rewrite_header(v, &host, port)? {
                replaced.push((name.clone(), n));
            }
        }
        let h = req.headers_mut();
        for (name, n) in replaced {
            let v = HeaderValue::from_str(&n)
                .map_err(|_| CredentialError::Unresolvable(name.to_string()))?;
            h.insert(name, v);
            injected = true;
        }
        Ok(())
    };
    if let Err(e) = rewrite() {
        let detail = e.to_string();
        t.emit(
            L7Decision::Deny,
            &method,
            &rule,
            &credentials::redact(&canon.path),
            Some(detail.clone()),
            generation,
        );
        let raw = match e {
            CredentialError::Unresolvable(_) => {
                response::json(400, "invalid_credential_placeholder", &detail, None)
            }
            CredentialError::NotBound { .. } => {
                response::json(403, "credential_endpoint_mismatch", &detail, None)
            }
        };
        return Ok(from_raw(&raw, &[]));
    }
    if scope.is_empty() {
        t.events.emit_l7(&L7Event {
            decision: L7Decision::Passthrough,
            method: method.clone(),
            dest: dest.clone(),
            path: credentials::redact(&canon.path),
            rule: "-".into(),
            reason: None,
            caller: t.caller.clone(),
            generation,
            credentials_injected: injected,
        });
    }
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    for n in [
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
    ] {
        headers.remove(HeaderName::from_static(n));
    }
    let body = ScanBody::new(body).boxed();
    let mut out = match Request::builder()
        .method(parts.method)
        .uri(target.as_str())
        .body(body)
    {
        Ok(r) => r,
        Err(_) => return Err(Closed::Path(PathError::NotOriginForm)),
    };
    *out.headers_mut() = headers;
    *out.version_mut() = parts.version;
    let sent = {
        let mut s = sender.lock().await;
        if s.ready().await.is_err() {
            return Ok(from_raw(&response::upstream_unreachable(&dest), &[]));
        }
        s.send_request(out)
    };
    let mut resp = match sent.await {
        Ok(r) => r,
        Err(_) => return Ok(from_raw(&response::upstream_unreachable(&dest), &[])),
    };
    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_up) = client_upgrade
    {
        let upstream_up = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(c), Ok(u)) = (client_up.await, upstream_up.await) {
                let mut c = TokioIo::new(c);
                let mut u = TokioIo::new(u);
                let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
            }
        });
    }
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(
        parts,
        body.map_err(|e| Box::new(e) as BoxError).boxed(),
    ))
}

fn deny_body(t: &Tunnel, rule: &str, method: &str, path: &str, reason: &str) -> serde_json::Value {
    let protocol = t
        .settings
        .as_ref()
        .map_or(Protocol::Rest, |s| s.protocol)
        .as_str();
    let host = t.dest.policy_host();
    serde_json::json!({
        "error": "policy_denied",
        "policy": rule,
        "rule": format!("{method} {path}"),
        "detail": reason,
        "layer": "l7",
        "protocol": protocol,
        "method": method,
        "path": path,
        "host": host,
        "port": t.dest.port,
        "binary": t.caller.exe,
        "rule_missing": {
            "type": "rest_allow",
            "layer": "l7",
            "method": method,
            "path": path,
            "host": host,
            "port": t.dest.port,
            "binary": t.caller.exe,
        },
        "next_steps": [
            format!("add an allow rule for {method} {path} to policy '{rule}', or remove the deny rule that matches it"),
        ],
    })
}

impl Tunnel {
    fn emit(
        &self,
        decision: L7Decision,
        method: &str,
        rule: &str,
        path: &str,
        reason: Option<String>,
        generation: u64,
    ) {
        self.events.emit_l7(&L7Event {
            decision,
            method: method.to_string(),
            dest: self.dest.display(),
            path: credentials::redact(path),
            rule: rule.to_string(),
            reason,
            caller: self.caller.clone(),
            generation,
            credentials_injected: false,
        });
    }
}
