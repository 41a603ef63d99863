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

/// One request of the tunnel, from its head to the response the client gets (or why the
/// tunnel closes instead).
pub(super) async fn handle(
    req: Request<Incoming>,
    t: &Tunnel,
    sender: &Sender,
    stale: &(dyn Fn() -> bool + Send + Sync),
    generation: u64,
    upgrade_slot: &UpgradeSlot,
) -> Result<Response<Body>, Closed> {
    let r = Req {
        t,
        method: req.method().as_str().to_string(),
        generation,
    };
    match r.forward(req, sender, stale, upgrade_slot).await {
        Ok(resp) | Err(Stop::Answer(resp)) => Ok(resp),
        Err(Stop::Close(c)) => Err(c),
    }
}

/// Why a request went no further: the tunnel closes, or the client gets this answer (a
/// refusal, or the upstream's absence).
enum Stop {
    Close(Closed),
    Answer(Response<Body>),
}

impl From<Closed> for Stop {
    fn from(c: Closed) -> Stop {
        Stop::Close(c)
    }
}

impl From<Response<Body>> for Stop {
    fn from(r: Response<Body>) -> Stop {
        Stop::Answer(r)
    }
}

/// What every step of one request reports with: its tunnel, method and generation.
struct Req<'a> {
    t: &'a Tunnel,
    method: String,
    generation: u64,
}

/// What the rules admitted: the rule that did (`-` with no L7 rules), and the request's
/// canonical path with its placeholders masked, as events and the WebSocket relay name it.
struct Admitted {
    rule: String,
    redacted: String,
}

// A step's refusal is the response the client gets, made once per refused request: returned
// by value rather than boxed.
#[allow(clippy::result_large_err)]
impl Req<'_> {
    /// The steps in order: the canonical target, the authority, the rules, the placeholders
    /// (head, then body), then upstream; and the upgrade the upstream agreed to, if any.
    async fn forward(
        &self,
        mut req: Request<Incoming>,
        sender: &Sender,
        stale: &(dyn Fn() -> bool + Send + Sync),
        upgrade_slot: &UpgradeSlot,
    ) -> Result<Response<Body>, Stop> {
        let t = self.t;
        let host = t.dest.policy_host();
        let scope = match &t.compiled {
            Some(r) => L7Scope::of(r, &host, t.dest.port, &t.caller),
            None => L7Scope::default(),
        };
        let canon = self.canonical(&req, &scope)?;
        self.check_host(req.headers(), &canon.path)?;
        if stale() {
            return Err(Closed::Stale.into());
        }
        let upgrade = req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        let websocket_endpoint = scope.protocol() == Some(Protocol::Websocket);
        let query = path::query_params(canon.query.as_deref());
        let admitted = self.admit(&scope, upgrade.as_deref(), &canon.path, &query)?;
        // Placeholders, only now that the request is admitted, from the store current now.
        let creds = t.credentials.current();
        let to = Dest {
            host: &host,
            port: t.dest.port,
            path: Some(&canon.path),
        };
        let mut target = canon.target();
        let mut noted = Injected::default();
        let injected = self.put_in_head(
            (&creds, &to),
            &mut target,
            req.headers_mut(),
            &mut noted,
            &admitted,
        )?;
        if scope.is_empty() {
            self.emit(
                L7Decision::Passthrough,
                "-",
                &admitted.redacted,
                None,
                injected,
            );
        }
        let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
        let (parts, incoming) = req.into_parts();
        let mut headers = parts.headers;
        strip_proxy_headers(&mut headers, websocket_endpoint);
        let head_only = parts.method == http::Method::HEAD;
        let rewrite_body = scope
            .select(&canon.path)
            .is_some_and(|(_, e)| e.request_body_credential_rewrite);
        let body = if rewrite_body && body::rewritable(&headers) {
            body::rewrite(incoming, &mut headers, &creds, &to, &mut noted)
                .await
                .map_err(|refusal| {
                    self.denied(&admitted, refusal.reason.clone());
                    from_raw(&refusal.response)
                })?
        } else {
            ScanBody::new(incoming).boxed()
        };
        if !noted.is_empty() {
            if !injected {
                self.refuse_exposure(&admitted)?;
            }
            // The answer is searched for the values put in: ask for it uncompressed.
            headers.remove(header::ACCEPT_ENCODING);
        }
        let mut out = Request::builder()
            .method(parts.method)
            .uri(target.as_str())
            .body(body)
            .map_err(|_| Closed::Path(PathError::NotOriginForm))?;
        *out.headers_mut() = headers;
        *out.version_mut() = parts.version;
        let mut resp = send(sender, out, &t.dest.display()).await?;
        if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
            && let Some(client) = client_upgrade
        {
            let websocket = websocket_endpoint
                .then(|| self.websocket_context(&host, &admitted, query))
                .flatten();
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

    /// The request's target in canonical form; a target with no single reading closes the
    /// tunnel, like a bad path.
    fn canonical(
        &self,
        req: &Request<Incoming>,
        scope: &L7Scope<'_>,
    ) -> Result<path::Canonical, Closed> {
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
                    path::canonicalize(&raw_target, true).and_then(|c| {
                        match scope.select(&c.path) {
                            Some((_, e)) if e.allow_encoded_slash => Ok(c),
                            _ => Err(PathError::EncodedSlash),
                        }
                    })
                }
                r => r,
            }
        };
        canon.map_err(|e| {
            let r = Some(e.to_string());
            self.emit(L7Decision::ParseRejected, "-", &raw_target, r, false);
            Closed::Path(e)
        })
    }

    /// Exactly one Host header, naming the tunnel's destination.
    fn check_host(&self, headers: &http::HeaderMap, path: &str) -> Result<(), Response<Body>> {
        // hyper keeps every Host field and the upstream gets them all: a second one would take
        // the request (and its credential) to another origin behind a shared front end.
        // HTTP/1.1 answers more than one Host with 400 (RFC 9112, section 3.2).
        let hosts = headers.get_all(header::HOST).iter().count();
        if hosts > 1 {
            let detail =
                format!("a request must carry exactly one Host header (it carried {hosts})");
            return Err(self.refuse("-", path, 400, "invalid_host_header", detail));
        }
        let host_ok = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| authority_matches(h, &self.t.dest, self.t.tls));
        if !host_ok {
            let detail = format!(
                "request authority does not match the tunnel's {}",
                self.t.dest.display()
            );
            return Err(self.refuse("-", path, 403, "request_authority_mismatch", detail));
        }
        Ok(())
    }

    /// The endpoint's rules on the request (none on an L4 endpoint): h2c is refused, a
    /// `websocket` endpoint takes only a WebSocket upgrade, then the first rule that decides.
    fn admit(
        &self,
        scope: &L7Scope<'_>,
        upgrade: Option<&str>,
        path: &str,
        query: &[(String, String)],
    ) -> Result<Admitted, Response<Body>> {
        let redacted = credentials::redact(path);
        let method = self.method.as_str();
        let deny = |rule: &str, reason: String| {
            self.emit(
                L7Decision::Deny,
                rule,
                &redacted,
                Some(reason.clone()),
                false,
            );
            respond::l7_deny(&Denied {
                dest: &self.t.dest,
                caller: &self.t.caller,
                protocol: scope.protocol().unwrap_or(Protocol::Rest),
                rule,
                method,
                path: &redacted,
                reason: &reason,
            })
        };
        if scope.is_empty() {
            return Ok(Admitted {
                rule: "-".to_string(),
                redacted,
            });
        }
        if upgrade == Some("h2c") {
            let detail =
                "HTTP/2 cleartext upgrade (h2c) is not supported for L7-inspected endpoints";
            return Err(self.refuse("-", path, 403, "policy_denied", detail.into()));
        }
        if scope.protocol() == Some(Protocol::Websocket)
            && (upgrade != Some("websocket") || method != "GET")
        {
            let key = scope.endpoints[0].0;
            let reason = "websocket endpoint requires a valid WebSocket upgrade request";
            return Err(deny(key, reason.to_string()));
        }
        let view = RequestView {
            method,
            path: &redacted,
            query,
        };
        let rule = match scope.evaluate(&view) {
            Verdict::Allow { rule } => {
                self.emit(L7Decision::Allow, &rule, &redacted, None, false);
                rule
            }
            Verdict::Audit { rule, reason } => {
                self.emit(L7Decision::Audit, &rule, &redacted, Some(reason), false);
                rule
            }
            Verdict::Deny { rule, reason } => return Err(deny(&rule, reason)),
        };
        Ok(Admitted { rule, redacted })
    }

    /// The placeholders of the target and the header values replaced; whether any was.
    fn put_in_head(
        &self,
        (creds, to): (&Credentials, &Dest<'_>),
        target: &mut String,
        headers: &mut http::HeaderMap,
        noted: &mut Injected,
        admitted: &Admitted,
    ) -> Result<bool, Response<Body>> {
        match rewrite_head(creds, to, target, headers, noted) {
            Ok(true) => {
                self.refuse_exposure(admitted)?;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => {
                self.denied(admitted, e.to_string());
                Err(credential_refusal(&e))
            }
        }
    }

    /// Refusals that depend on a value having been put in: TRACE and TRACK send the request
    /// back as the body, and plain HTTP inside a CONNECT to 443 would carry the value in clear
    /// text where the binding meant TLS (a binding for another port names that port on purpose,
    /// plain or not).
    fn refuse_exposure(&self, admitted: &Admitted) -> Result<(), Response<Body>> {
        refuse_exposure(&self.method, self.t).map_err(|(error, detail)| {
            self.denied(admitted, detail.clone());
            from_raw(&response::json(403, error, &detail, None))
        })
    }

    /// What a `websocket` endpoint's relay checks each message against (none without rules).
    fn websocket_context(
        &self,
        host: &str,
        admitted: &Admitted,
        query: Vec<(String, String)>,
    ) -> Option<websocket::Context> {
        let t = self.t;
        t.compiled.as_ref().map(|rules| websocket::Context {
            rules: rules.clone(),
            host: host.to_string(),
            port: t.dest.port,
            dest: t.dest.display(),
            caller: t.caller.clone(),
            path: admitted.redacted.clone(),
            query,
            events: t.events.clone(),
            generation: self.generation,
            limits: t.websocket.clone(),
            idle: t.idle_timeout,
        })
    }

    fn emit(
        &self,
        decision: L7Decision,
        rule: &str,
        path: &str,
        reason: Option<String>,
        injected: bool,
    ) {
        let (m, g) = (&self.method, self.generation);
        self.t.emit(decision, m, rule, path, reason, g, injected);
    }

    /// Log a request refused after the rules admitted it (its event says why).
    fn denied(&self, admitted: &Admitted, reason: String) {
        self.emit(
            L7Decision::Deny,
            &admitted.rule,
            &admitted.redacted,
            Some(reason),
            false,
        );
    }

    /// Log a request refused before the rules and answer it with `error`.
    fn refuse(
        &self,
        rule: &str,
        path: &str,
        status: u16,
        error: &str,
        detail: String,
    ) -> Response<Body> {
        self.emit(L7Decision::Deny, rule, path, Some(detail.clone()), false);
        from_raw(&response::json(status, error, &detail, None))
    }
}

/// The proxy's own headers go no further; a `websocket` endpoint's upgrade asks for no
/// compression, so that every text message stays readable by the relay.
fn strip_proxy_headers(headers: &mut http::HeaderMap, websocket_endpoint: bool) {
    for n in [
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
    ] {
        headers.remove(HeaderName::from_static(n));
    }
    if websocket_endpoint {
        headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    }
}

/// The request sent on the tunnel's upstream connection; an upstream that is gone is answered
/// 502 to the client.
async fn send(
    sender: &Sender,
    out: Request<Body>,
    dest: &str,
) -> Result<Response<Incoming>, Response<Body>> {
    let sent = {
        let mut s = sender.lock().await;
        if s.ready().await.is_err() {
            return Err(from_raw(&response::upstream_unreachable(dest)));
        }
        s.send_request(out)
    };
    sent.await
        .map_err(|_| from_raw(&response::upstream_unreachable(dest)))
}

/// Why a value may not be put into this request, if it may not (see
/// [`Req::refuse_exposure`]).
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
