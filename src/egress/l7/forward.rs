//! A plain-HTTP forward (`GET http://…` to the proxy), checked before its dial: its target
//! canonicalised and, on an L7 endpoint, its request decided by the same rules as a request
//! inside a tunnel. Forwarded requests are never rewritten, so a placeholder in one is refused.

use super::super::credentials;
use super::super::event::{EventSink, L7Decision, L7Event};
use super::super::relay::{ForwardCheck, Refusal};
use super::super::response;
use super::path;
use super::rules::{CompiledRules, L7Scope, RequestView, Verdict};

/// The request-target to send upstream, or the refusal.
pub(super) fn check(
    f: &ForwardCheck<'_>,
    compiled: Option<&CompiledRules>,
    events: &dyn EventSink,
) -> Result<String, Refusal> {
    let what = format!("{} {}", f.method, f.dest.display());
    let bad_target = || Refusal {
        response: response::json(
            400,
            "invalid_request_target",
            "request-target must be canonical",
            None,
        ),
        reason: "request-target must be canonical".into(),
    };
    // Forwarded requests get no rewriting: a placeholder would go upstream as it is.
    if credentials::has_marker(f.head) {
        return Err(Refusal {
            response: response::json(
                400,
                "invalid_credential_placeholder",
                "request-target contains an invalid credential placeholder",
                None,
            ),
            reason: "credential placeholders are replaced only inside CONNECT tunnels".into(),
        });
    }
    let scope = match (compiled, f.settings) {
        (Some(r), Some(s)) if s.protocol.is_l7() => {
            L7Scope::of(r, &f.dest.policy_host(), f.dest.port, f.caller)
        }
        _ => L7Scope::default(),
    };
    let slash_ok = |c: &path::Canonical| {
        scope
            .select(&c.path)
            .is_some_and(|(_, e)| e.allow_encoded_slash)
    };
    let canon = match path::canonicalize(f.path_and_query, false) {
        Ok(c) => c,
        Err(path::PathError::EncodedSlash) => match path::canonicalize(f.path_and_query, true) {
            Ok(c) if slash_ok(&c) => c,
            _ => return Err(bad_target()),
        },
        Err(_) => return Err(bad_target()),
    };
    if scope.is_empty() {
        return Ok(canon.target());
    }
    let query = path::query_params(canon.query.as_deref());
    let view = RequestView {
        method: f.method,
        path: &canon.path,
        query: &query,
    };
    let verdict = scope.evaluate(&view);
    let emit = |decision, rule: &str, reason: Option<String>| {
        events.emit_l7(&L7Event {
            decision,
            method: f.method.to_string(),
            dest: f.dest.display(),
            path: canon.path.clone(),
            rule: rule.to_string(),
            reason,
            caller: f.caller.clone(),
            generation: f.revision.generation,
            credentials_injected: false,
        })
    };
    match verdict {
        Verdict::Allow { rule } => emit(L7Decision::Allow, &rule, None),
        Verdict::Audit { rule, reason } => emit(L7Decision::Audit, &rule, Some(reason)),
        Verdict::Deny { rule, reason } => {
            emit(L7Decision::Deny, &rule, Some(reason.clone()));
            let detail = if reason == "no L7 endpoint path matched request" {
                format!("{what}{} did not match an L7 endpoint path", canon.path)
            } else {
                format!("{what}{} denied by L7 policy: {reason}", canon.path)
            };
            return Err(Refusal {
                response: response::json(403, "policy_denied", &detail, Some(&reason)),
                reason,
            });
        }
    }
    Ok(canon.target())
}
