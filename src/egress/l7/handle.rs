//! One request inside an inspected tunnel, in order: the canonical target, the authority, the
//! rules (the WebSocket ones on a `websocket` endpoint), the credential placeholders (header
//! values, the target, and the body where the endpoint asks), then upstream.

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::super::credentials::{self, CredentialError, Credentials, Dest, Injected};
use super::super::response;
use super::body::{self, ScanBody};
use super::event::L7Decision;
use super::path::{self, PathError};
use super::redact;
use super::respond::{self, Body, Denied, from_raw};
use super::rules::{L7Scope, RequestView, Verdict};
use super::tunnel::{Closed, Tunnel, Upgrade, UpgradeSlot};
use super::websocket;
use crate::policy::network::Protocol;

type Sender = tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Body>>;

fn authority_matches(host_header: &str, dest: &super::super::request::HostPort, tls: bool) -> bool {
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

/// Replace the placeholders of the target and the header values.
fn rewrite_head(
    creds: &Credentials,
    to: &Dest<'_>,
    target: &mut String,
    headers: &mut http::HeaderMap,
    noted: &mut Injected,
) -> Result<bool, CredentialError> {
    let mut injected = false;
    if credentials::has_encoded_marker(target) {
        return Err(CredentialError::Unresolvable(
            "a percent-encoded placeholder in the request target".into(),
        ));
    }
    if let Some(n) = creds.rewrite_noting(target, to, noted)? {
        *target = n;
        injected = true;
    }
    let mut replaced = Vec::new();
    for (name, value) in headers.iter() {
        let Ok(v) = value.to_str() else {
            if credentials::has_marker(value.as_bytes()) {
                return Err(CredentialError::Unresolvable(name.to_string()));
            }
            continue;
        };
        if let Some(n) = creds.rewrite_header_noting(v, to, noted)? {
            replaced.push((name.clone(), n));
        }
    }
    for (name, n) in replaced {
        let v = HeaderValue::from_str(&n)
            .map_err(|_| CredentialError::Unresolvable(name.to_string()))?;
        headers.insert(name, v);
        injected = true;
    }
    Ok(injected)
}

fn credential_refusal(e: &CredentialError) -> Response<Body> {
    let detail = e.to_string();
    from_raw(&match e {
        CredentialError::Unresolvable(_) => {
            response::json(400, "invalid_credential_placeholder", &detail, None)
        }
        CredentialError::NotBound { .. } => {
            response::json(403, "credential_endpoint_mismatch", &detail, None)
        }
    })
}

pub(super) async fn handle(
    mut req: Request<Incoming>,
    t: &Tunnel,
    sender: &Sender,
    stale: &(dyn Fn() -> bool + Send + Sync),
    generation: u64,
    upgrade_slot: &UpgradeSlot,
) -> Result<Response<Body>, Closed> {
    let method = req.method().as_str().to_string();
    let dest = t.dest.display();
    let host = t.dest.policy_host();
    let scope = match &t.compiled {
        Some(r) => L7Scope::of(r, &host, t.dest.port, &t.caller),
        None => L7Scope::default(),
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
                if scope
                    .endpoints
                    .iter()
                    .any(|(_, e)| e.endpoint.allow_encoded_slash) =>
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
            let r = Some(e.to_string());
            t.emit(
                L7Decision::ParseRejected,
                &method,
                "-",
                &raw_target,
                r,
                generation,
                false,
            );
            return Err(Closed::Path(e));
        }
    };
    // hyper keeps every Host field and the upstream gets them all: a second one would take
    // the request (and its credential) to another origin behind a shared front end. HTTP/1.1
    // answers more than one Host with 400 (RFC 9112, section 3.2).
    let hosts = req.headers().get_all(header::HOST).iter().count();
    if hosts > 1 {
        let detail = format!("a request must carry exactly one Host header (it carried {hosts})");
        denied(t, &method, "-", &canon.path, generation, detail.clone());
        return Ok(from_raw(&response::json(
            400,
            "invalid_host_header",
            &detail,
            None,
        )));
    }
    let host_ok = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| authority_matches(h, &t.dest, t.tls));
    if !host_ok {
        let detail = format!("request authority does not match the tunnel's {dest}");
        denied(t, &method, "-", &canon.path, generation, detail.clone());
        return Ok(from_raw(&response::json(
            403,
            "request_authority_mismatch",
            &detail,
            None,
        )));
    }
    if stale() {
        return Err(Closed::Stale);
    }
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    let websocket_endpoint = scope.protocol() == Some(Protocol::Websocket);
    let redacted = credentials::redact(&canon.path);
    let query = path::query_params(canon.query.as_deref());
    let deny = |rule: &str, reason: String| {
        denied(t, &method, rule, &redacted, generation, reason.clone());
        respond::l7_deny(&Denied {
            dest: &t.dest,
            caller: &t.caller,
            protocol: scope.protocol().unwrap_or(Protocol::Rest),
            rule,
            method: &method,
            path: &redacted,
            reason: &reason,
        })
    };
    let mut rule = "-".to_string();
    if !scope.is_empty() {
        if upgrade.as_deref() == Some("h2c") {
            let detail =
                "HTTP/2 cleartext upgrade (h2c) is not supported for L7-inspected endpoints";
            denied(t, &method, "-", &canon.path, generation, detail.into());
            return Ok(from_raw(&response::json(
                403,
                "policy_denied",
                detail,
                None,
            )));
        }
        if websocket_endpoint && (upgrade.as_deref() != Some("websocket") || method != "GET") {
            let key = scope.endpoints[0].0;
            let reason = "websocket endpoint requires a valid WebSocket upgrade request";
            return Ok(deny(key, reason.to_string()));
        }
        let view = RequestView {
            method: &method,
            path: &redacted,
            query: &query,
        };
        match scope.evaluate(&view) {
            Verdict::Allow { rule: r } => {
                t.emit(
                    L7Decision::Allow,
                    &method,
                    &r,
                    &redacted,
                    None,
                    generation,
                    false,
                );
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
                    false,
                );
                rule = r;
            }
            Verdict::Deny { rule: r, reason } => return Ok(deny(&r, reason)),
        }
    }
    // Placeholders, only now that the request is admitted, from the store current now.
    let creds = t.credentials.current();
    let to = Dest {
        host: &host,
        port: t.dest.port,
        path: Some(&canon.path),
    };
    let mut target = canon.target();
    let mut noted = Injected::default();
    let injected = match rewrite_head(&creds, &to, &mut target, req.headers_mut(), &mut noted) {
        Ok(true) => {
            if let Err((error, detail)) = refuse_exposure(&method, t) {
                denied(t, &method, &rule, &redacted, generation, detail.clone());
                return Ok(from_raw(&response::json(403, error, &detail, None)));
            }
            true
        }
        Ok(false) => false,
        Err(e) => {
            denied(t, &method, &rule, &redacted, generation, e.to_string());
            return Ok(credential_refusal(&e));
        }
    };
    if scope.is_empty() {
        t.emit(
            L7Decision::Passthrough,
            &method,
            "-",
            &redacted,
            None,
            generation,
            injected,
        );
    }
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (parts, incoming) = req.into_parts();
    let mut headers = parts.headers;
    for n in [
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
    ] {
        headers.remove(HeaderName::from_static(n));
    }
    if websocket_endpoint {
        // No compression: every text message must be readable by the relay.
        headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    }
    let head_only = parts.method == http::Method::HEAD;
    let rewrite_body = scope
        .select(&canon.path)
        .is_some_and(|(_, e)| e.request_body_credential_rewrite);
    let body = if rewrite_body && body::rewritable(&headers) {
        match body::rewrite(incoming, &mut headers, &creds, &to, &mut noted).await {
            Ok(b) => b,
            Err(refusal) => {
                denied(
                    t,
                    &method,
                    &rule,
                    &redacted,
                    generation,
                    refusal.reason.clone(),
                );
                return Ok(from_raw(&refusal.response));
            }
        }
    } else {
        ScanBody::new(incoming).boxed()
    };
    if !noted.is_empty() {
        if !injected && let Err((error, detail)) = refuse_exposure(&method, t) {
            denied(t, &method, &rule, &redacted, generation, detail.clone());
            return Ok(from_raw(&response::json(403, error, &detail, None)));
        }
        // The answer is searched for the values put in: ask for it uncompressed.
        headers.remove(header::ACCEPT_ENCODING);
    }
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
            return Ok(from_raw(&response::upstream_unreachable(&dest)));
        }
        s.send_request(out)
    };
    let mut resp = match sent.await {
        Ok(r) => r,
        Err(_) => return Ok(from_raw(&response::upstream_unreachable(&dest))),
    };
    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
        && let Some(client) = client_upgrade
    {
        let websocket = match (&t.compiled, websocket_endpoint) {
            (Some(rules), true) => Some(websocket::Context {
                rules: rules.clone(),
                host: host.clone(),
                port: t.dest.port,
                dest: dest.clone(),
                caller: t.caller.clone(),
                path: redacted.clone(),
                query,
                events: t.events.clone(),
                generation,
                limits: t.websocket.clone(),
                idle: t.idle_timeout,
            }),
            _ => None,
        };
        *upgrade_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Upgrade {
            client,
            upstream: hyper::upgrade::on(&mut resp),
            websocket,
        });
    }
    let (parts, body) = resp.into_parts();
    let resp = Response::from_parts(
        parts,
        body.map_err(|e| Box::new(e) as respond::BoxError).boxed(),
    );
    Ok(redact::response(resp, noted, head_only))
}

/// Refusals that depend on a value having been put in: TRACE and TRACK send the request back
/// as the body, and plain HTTP inside a CONNECT to 443 would carry the value in clear text
/// where the binding meant TLS (a binding for another port names that port on purpose, plain
/// or not).
/// Log a request refused before it went anywhere (its event says why).
fn denied(t: &Tunnel, method: &str, rule: &str, path: &str, generation: u64, reason: String) {
    t.emit(
        L7Decision::Deny,
        method,
        rule,
        path,
        Some(reason),
        generation,
        false,
    );
}

fn refuse_exposure(method: &str, t: &Tunnel) -> Result<(), (&'static str, String)> {
    if method.eq_ignore_ascii_case("TRACE") || method.eq_ignore_ascii_case("TRACK") {
        return Err((
            "credential_reflection_refused",
            format!("{method} echoes the request; it may not carry a credential"),
        ));
    }
    if !t.tls && t.dest.port == 443 {
        return Err((
            "credential_requires_tls",
            format!(
                "a credential for {} goes only inside TLS; this request is plain HTTP",
                t.dest.display()
            ),
        ));
    }
    Ok(())
}
