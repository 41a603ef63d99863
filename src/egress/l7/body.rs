//! A request body passed on frame by frame, refused as soon as it carries a credential
//! placeholder: without body rewriting, a placeholder in a body must not reach the upstream
//! (its name alone says which credential the child tried to use).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::super::credentials::MARKER;

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
