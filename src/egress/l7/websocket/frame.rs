//! Frames on the wire: a header read on its own, so that a payload can be streamed through in
//! bounded chunks (binary and server frames) or read into an assembly that was admitted first
//! (client text).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes moved per step when a payload is streamed or read: what one relay direction holds.
pub const CHUNK: usize = 16 * 1024;

/// One frame's header, and its bytes as they came (passed on unchanged when the payload is).
#[derive(Debug, Clone)]
pub struct Header {
    pub fin: bool,
    pub rsv: u8,
    pub opcode: u8,
    pub masked: bool,
    pub key: [u8; 4],
    pub len: u64,
    raw: [u8; 14],
    raw_len: usize,
}

impl Header {
    pub fn bytes(&self) -> &[u8] {
        &self.raw[..self.raw_len]
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The stream failed or ended inside a frame.
    Io,
    /// The payload is longer than the limit: read no further.
    TooBig,
    /// No byte came for the idle time of the read.
    Idle,
}

/// Read one header; `Ok(None)` at a clean end between frames. A payload longer than
/// `max_payload` is refused before any of it is read.
pub async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    max_payload: u64,
) -> Result<Option<Header>, ReadError> {
    let mut raw = [0u8; 14];
    match r.read(&mut raw[..1]).await {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(_) => return Err(ReadError::Io),
    }
    r.read_exact(&mut raw[1..2])
        .await
        .map_err(|_| ReadError::Io)?;
    let mut at = 2;
    let len = match raw[1] & 0x7f {
        126 => {
            r.read_exact(&mut raw[2..4])
                .await
                .map_err(|_| ReadError::Io)?;
            at = 4;
            u64::from(u16::from_be_bytes([raw[2], raw[3]]))
        }
        127 => {
            r.read_exact(&mut raw[2..10])
                .await
                .map_err(|_| ReadError::Io)?;
            at = 10;
            u64::from_be_bytes(raw[2..10].try_into().unwrap_or_default())
        }
        n => u64::from(n),
    };
    if len > max_payload {
        return Err(ReadError::TooBig);
    }
    let masked = raw[1] & 0x80 != 0;
    let mut key = [0u8; 4];
    if masked {
        r.read_exact(&mut raw[at..at + 4])
            .await
            .map_err(|_| ReadError::Io)?;
        key.copy_from_slice(&raw[at..at + 4]);
        at += 4;
    }
    Ok(Some(Header {
        fin: raw[0] & 0x80 != 0,
        rsv: (raw[0] >> 4) & 0x7,
        opcode: raw[0] & 0x0f,
        masked,
        key,
        len,
        raw,
        raw_len: at,
    }))
}

/// Append the payload of `h` to `out`, unmasked, a chunk at a time, each chunk within `idle`
/// of the last. The buffer grows with what arrives, not with what the header announced.
pub async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    h: &Header,
    out: &mut Vec<u8>,
    idle: Duration,
) -> Result<(), ReadError> {
    let from = out.len();
    let mut left = h.len;
    while left > 0 {
        let want = left.min(CHUNK as u64);
        out.reserve(want as usize);
        let mut part = (&mut *r).take(want);
        let n = match tokio::time::timeout(idle, part.read_buf(out)).await {
            Err(_) => return Err(ReadError::Idle),
            Ok(Ok(0)) | Ok(Err(_)) => return Err(ReadError::Io),
            Ok(Ok(n)) => n,
        };
        left -= n as u64;
    }
    if h.masked {
        apply_mask(&mut out[from..], h.key);
    }
    Ok(())
}

/// Pass a frame through as it came: its header, then its payload in chunks of at most
/// [`CHUNK`], never held whole.
pub async fn stream<R, W>(r: &mut R, w: &mut W, h: &Header) -> Result<(), ReadError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    w.write_all(h.bytes()).await.map_err(|_| ReadError::Io)?;
    let mut left = h.len;
    let mut buf = vec![0u8; (left.min(CHUNK as u64)) as usize];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = match r.read(&mut buf[..want]).await {
            Ok(0) | Err(_) => return Err(ReadError::Io),
            Ok(n) => n,
        };
        w.write_all(&buf[..n]).await.map_err(|_| ReadError::Io)?;
        left -= n as u64;
    }
    Ok(())
}

pub fn apply_mask(p: &mut [u8], key: [u8; 4]) {
    for (i, b) in p.iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
}

/// One frame on the wire; masked with a fresh key when `mask` (client to server).
pub fn encode(fin: bool, opcode: u8, payload: &[u8], mask: bool) -> Vec<u8> {
    let key: Option<[u8; 4]> = mask.then(rand::random);
    let mut out = head(fin, opcode, payload.len(), key);
    let at = out.len();
    out.extend_from_slice(payload);
    if let Some(key) = key {
        apply_mask(&mut out[at..], key);
    }
    out
}

/// A frame's header for a payload of `len` bytes, masked with `key` when given.
pub fn head(fin: bool, opcode: u8, len: usize, key: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(14);
    out.push(if fin { 0x80 } else { 0 } | (opcode & 0x0f));
    let m = if key.is_some() { 0x80 } else { 0 };
    match len {
        n if n < 126 => out.push(m | n as u8),
        n if n <= 0xffff => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if let Some(key) = key {
        out.extend_from_slice(&key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn frames_round_trip_masked_and_unmasked() {
        for len in [0usize, 5, 125, 126, 65535, 65536, 100_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            for mask in [false, true] {
                let bytes = encode(true, 1, &payload, mask);
                let mut r = bytes.as_slice();
                let h = read_header(&mut r, 1 << 20).await.unwrap().unwrap();
                assert_eq!((h.fin, h.opcode, h.masked), (true, 1, mask));
                assert_eq!(h.bytes(), &bytes[..bytes.len() - len]);
                let mut got = Vec::new();
                read_payload(&mut r, &h, &mut got, IDLE).await.unwrap();
                assert_eq!(got, payload);
                // Streamed: the same bytes out, header and (still masked) payload.
                let mut r = bytes.as_slice();
                let h = read_header(&mut r, 1 << 20).await.unwrap().unwrap();
                let mut out = Vec::new();
                stream(&mut r, &mut out, &h).await.unwrap();
                assert_eq!(out, bytes);
            }
        }
        let big = [0x82u8, 127, 0, 0, 0, 0, 2, 0, 0, 0];
        assert!(matches!(
            read_header(&mut big.as_slice(), 16 << 20).await,
            Err(ReadError::TooBig)
        ));
    }
}
