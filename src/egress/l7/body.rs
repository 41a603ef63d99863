//! Request bodies and credential placeholders. Without body rewriting a body is passed on
//! frame by frame and refused as soon as it carries a placeholder: the placeholder must not
//! reach the upstream (its name alone says which credential the child tried to use). With
//! `request_body_credential_rewrite` a textual body (JSON, form, `text/*`, UTF-8) is buffered
//! up to 256 KiB and its placeholders replaced, as in the head.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::super::credentials::{CredentialError, Credentials, Dest, Injected, MARKER};
use super::super::relay::Refusal;
use super::super::response;

/// The body failed: the placeholder marker was seen.
#[derive(Debug, thiserror::Error)]
#[error(
    "request body contains a credential placeholder; body rewriting is not enabled for this endpoint"
)]
pub struct PlaceholderInBody;

/// `Incoming`, scanned for [`MARKER`] across frame boundaries.
pub struct ScanBody {
    inner: Incoming,
    /// The last `MARKER.len() - 1` bytes seen, to find a marker split between frames.
    tail: Vec<u8>,
}

impl ScanBody {
    pub fn new(inner: Incoming) -> ScanBody {
        ScanBody {
            inner,
            tail: Vec::new(),
        }
    }
}

/// Whether `tail ++ data` holds the marker; `tail` becomes the end of it.
pub fn scan(tail: &mut Vec<u8>, data: &[u8]) -> bool {
    let m = MARKER.as_bytes();
    let mut joined = std::mem::take(tail);
    joined.extend_from_slice(data);
    let found = joined.windows(m.len()).any(|w| w == m);
    let keep = joined.len().min(m.len() - 1);
    *tail = joined[joined.len() - keep..].to_vec();
    found
}

impl Body for ScanBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref()
                    && scan(&mut this.tail, d)
                {
                    return Poll::Ready(Some(Err(Box::new(PlaceholderInBody))));
                }
                // Trailers are not rewritten: one holding a placeholder fails the body too.
                if let Some(t) = f.trailers_ref()
                    && t.iter().any(|(k, v)| {
                        super::super::credentials::has_marker(v.as_bytes())
                            || super::super::credentials::has_marker(k.as_str().as_bytes())
                    })
                {
                    return Poll::Ready(Some(Err(Box::new(PlaceholderInBody))));
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A body rewritten whole is buffered up to this (`request_body_credential_rewrite`).
pub const MAX_REWRITE_BODY: usize = 256 * 1024;
/// ... and must arrive whole within this (408 past it).
pub const REWRITE_BODY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether a body with these headers may be rewritten: UTF-8 JSON, form or `text/*` (no other
/// charset), not compressed.
pub fn rewritable(headers: &http::HeaderMap) -> bool {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let mut parts = ct.split(';').map(str::trim);
    let media = parts.next().unwrap_or("");
    let textual = media == "application/json"
        || media == "application/x-www-form-urlencoded"
        || media.starts_with("text/");
    let utf8 = parts.all(|p| {
        p.strip_prefix("charset=")
            .is_none_or(|c| c.trim_matches('"').eq_ignore_ascii_case("utf-8"))
    });
    let encoded = headers
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    textual && utf8 && !encoded
}

/// Buffer `body` (at most [`MAX_REWRITE_BODY`]), replace its placeholders for `to`, and fix the
/// framing headers. A body too big, not UTF-8 but carrying the marker, or with a placeholder
/// that cannot be resolved here is refused.
pub async fn rewrite(
    body: Incoming,
    headers: &mut http::HeaderMap,
    creds: &Credentials,
    to: &Dest<'_>,
    noted: &mut Injected,
) -> Result<super::respond::Body, Refusal> {
    use http_body_util::BodyExt;
    let too_big = || Refusal {
        response: response::json(
            413,
            "request_body_too_large",
            &format!("request body credential rewrite buffers at most {MAX_REWRITE_BODY} bytes"),
            None,
        ),
        reason: format!("request body over {MAX_REWRITE_BODY} bytes on a rewriting endpoint"),
    };
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_REWRITE_BODY as u64) {
        return Err(too_big());
    }
    // A client that stops sending holds the buffer and the request: it gets a deadline.
    let collect = http_body_util::Limited::new(body, MAX_REWRITE_BODY).collect();
    let bytes = match tokio::time::timeout(REWRITE_BODY_DEADLINE, collect).await {
        Ok(Ok(c)) => c.to_bytes(),
        Ok(Err(_)) => return Err(too_big()),
        Err(_) => {
            return Err(Refusal {
                response: response::json(
                    408,
                    "request_body_timeout",
                    &format!(
                        "a body to rewrite must arrive whole within {}s",
                        REWRITE_BODY_DEADLINE.as_secs()
                    ),
                    None,
                ),
                reason: "request body for credential rewrite did not arrive in time".into(),
            });
        }
    };
    let out = match std::str::from_utf8(&bytes) {
        Ok(text) => match creds.rewrite_noting(text, to, noted) {
            Ok(Some(new)) => bytes::Bytes::from(new),
            Ok(None) => bytes,
            Err(e) => {
                let detail = e.to_string();
                let (code, error) = match e {
                    CredentialError::Unresolvable(_) => (400, "invalid_credential_placeholder"),
                    CredentialError::NotBound { .. } => (403, "credential_endpoint_mismatch"),
                };
                return Err(Refusal {
                    response: response::json(code, error, &detail, None),
                    reason: detail,
                });
            }
        },
        Err(_) if super::super::credentials::has_marker(&bytes) => {
            return Err(Refusal {
                response: response::json(
                    400,
                    "invalid_credential_placeholder",
                    "request body is not UTF-8 and carries a credential placeholder",
                    None,
                ),
                reason: "a placeholder in a body that is not UTF-8".into(),
            });
        }
        Err(_) => bytes,
    };
    headers.remove(http::header::TRANSFER_ENCODING);
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(out.len()),
    );
    Ok(http_body_util::Full::new(out)
        .map_err(|never| match never {})
        .boxed())
}
