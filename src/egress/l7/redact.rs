//! The way back of a request that carried a credential: an upstream that repeats what it got
//! (an error page quoting the path, CORS reflecting `Origin`, an API repeating a body field)
//! would hand the real value to the sandbox. So every value put into the request is replaced
//! by its placeholder again in the response's headers and, streaming, in its body: the body
//! keeps the last `longest value - 1` bytes back until the next frame shows whether a value
//! starts there. `Accept-Encoding` is removed from such requests so the answer comes back
//! searchable; an answer compressed anyway is refused (502), because the value could be in
//! it undetected. Encoded echoes (base64 but for `Basic`, percent-encoding) are not caught:
//! SECURITY.md says so.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Frame;

use super::super::credentials::Injected;
use super::super::response;
use super::respond::{Body, BoxError, from_raw};

/// A response body with the injected values replaced by their placeholders.
struct RedactBody {
    inner: Body,
    injected: Injected,
    /// Bytes held back: a value may start in them.
    tail: Vec<u8>,
    /// Trailers waiting for the tail to be flushed before them.
    trailers: Option<http::HeaderMap>,
    done: bool,
}

impl hyper::body::Body for RedactBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(t) = this.trailers.take() {
            this.done = true;
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => {
                        let mut joined = std::mem::take(&mut this.tail);
                        joined.extend_from_slice(&d);
                        let keep = this.injected.longest().saturating_sub(1);
                        let upto = joined.len().saturating_sub(keep);
                        let (out, at) = this.injected.redact_prefix(&joined, upto);
                        this.tail = joined[at..].to_vec();
                        if out.is_empty() {
                            continue;
                        }
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
                    }
                    Err(f) => {
                        // Trailers: the tail first, then them, redacted.
                        let Ok(mut t) = f.into_trailers() else {
                            continue;
                        };
                        redact_headers(&mut t, &this.injected);
                        if this.tail.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::trailers(t))));
                        }
                        this.trailers = Some(t);
                        let out = this.injected.redact(&std::mem::take(&mut this.tail));
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
                    }
                },
                Poll::Ready(None) => {
                    this.done = true;
                    if this.tail.is_empty() {
                        Poll::Ready(None)
                    } else {
                        let out = this.injected.redact(&std::mem::take(&mut this.tail));
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
                    }
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.tail.is_empty() && self.trailers.is_none() && self.inner.is_end_stream())
    }
}

fn redact_headers(h: &mut http::HeaderMap, injected: &Injected) {
    for v in h.values_mut() {
        let new = injected.redact(v.as_bytes());
        if new != v.as_bytes() {
            *v = HeaderValue::from_bytes(&new).unwrap_or(HeaderValue::from_static(""));
        }
    }
}

/// The response to a request that carried `injected`, values replaced by their
/// placeholders; a compressed one is refused.
pub fn response(resp: Response<Body>, injected: Injected, head: bool) -> Response<Body> {
    if injected.is_empty() {
        return resp;
    }
    let encoded = resp
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let status = resp.status();
    let bodiless = head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if encoded && !bodiless {
        return from_raw(&response::json(
            502,
            "credential_response_encoded",
            "the upstream answered a request carrying a credential with a compressed body, \
             which cannot be searched for the credential",
            None,
        ));
    }
    let (mut parts, body) = resp.into_parts();
    redact_headers(&mut parts.headers, &injected);
    if bodiless {
        return Response::from_parts(parts, body);
    }
    // The length changes with every replacement: the client gets chunks (or an end).
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = RedactBody {
        inner: body,
        injected,
        tail: Vec::new(),
        trailers: None,
        done: false,
    };
    Response::from_parts(parts, body.boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn values_cut_across_frames_are_replaced() {
        let mut creds = super::super::super::credentials::Credentials::new(1, "");
        creds.insert(
            "K",
            "SECRETVALUE".into(),
            vec![super::super::super::credentials::Binding::new("h", 1)],
        );
        let mut noted = Injected::default();
        let to = super::super::super::credentials::Dest {
            host: "h",
            port: 1,
            path: None,
        };
        creds
            .rewrite_noting("x openshell:resolve:env:K", &to, &mut noted)
            .unwrap();
        let text = b"a SECRETVALUE b SECRETVALUESECRETVALUE SECRETVAL".to_vec();
        for cut in 1..8 {
            let frames: Vec<Result<Frame<Bytes>, BoxError>> = text
                .chunks(cut)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            let inner = http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed();
            let resp = response(Response::new(inner), noted.clone(), false);
            let out = resp.into_body().collect().await.unwrap().to_bytes();
            let p = "openshell:resolve:env:K";
            assert_eq!(
                String::from_utf8_lossy(&out),
                format!("a {p} b {p}{p} SECRETVAL"),
                "cut {cut}"
            );
        }
    }
}
