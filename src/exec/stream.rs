//! Streaming a child's output: copy as it arrives, never hold more than one buffer, and past
//! the cap keep draining (so the child is never blocked on a full pipe) while discarding.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What one stream carried.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StreamStats {
    /// Bytes the child wrote, including any discarded past the cap.
    pub bytes: u64,
    /// Bytes passed on.
    pub forwarded: u64,
    pub truncated: bool,
    /// The last byte passed on was not a newline: whatever we print next on the same stream
    /// would be glued onto the child's unterminated line.
    #[serde(skip)]
    pub open_line: bool,
}

const CHUNK: usize = 64 * 1024;

/// Copy `r` to `w` until EOF. With `cap`, at most `cap` bytes are forwarded, then a marker
/// line naming the stream ends the output. A failing writer (the reader went away) does not
/// stop the draining.
pub async fn pump<R, W>(
    mut r: R,
    w: &mut W,
    cap: Option<u64>,
    name: &str,
) -> io::Result<StreamStats>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    let mut st = StreamStats::default();
    let mut writer_ok = true;
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        st.bytes += n as u64;
        let room = cap
            .map_or(n as u64, |c| c.saturating_sub(st.forwarded))
            .min(n as u64) as usize;
        if room < n {
            st.truncated = true;
        }
        if room > 0 && writer_ok {
            if w.write_all(&buf[..room]).await.is_err() {
                writer_ok = false;
            } else {
                st.forwarded += room as u64;
                st.open_line = buf[room - 1] != b'\n';
            }
        }
    }
    if st.truncated && writer_ok {
        let marker = format!(
            "\n[openshell-sandbox: {name} truncated: {} of {} bytes shown (--max-output)]\n",
            st.forwarded, st.bytes
        );
        if w.write_all(marker.as_bytes()).await.is_ok() {
            st.open_line = false;
        }
    }
    if writer_ok {
        let _ = w.flush().await;
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn caps_and_marks() {
        let data = vec![b'x'; 300_000];
        let mut out = Vec::new();
        let st = pump(&data[..], &mut out, Some(1000), "stdout")
            .await
            .unwrap();
        assert_eq!(st.bytes, 300_000);
        assert_eq!(st.forwarded, 1000);
        assert!(st.truncated);
        let text = String::from_utf8_lossy(&out[1000..]).into_owned();
        assert!(
            text.contains("stdout truncated: 1000 of 300000 bytes"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn no_cap_copies_everything() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        let st = pump(&data[..], &mut out, None, "stdout").await.unwrap();
        assert_eq!(out, data);
        assert!(!st.truncated);
        assert!(
            st.open_line,
            "the data ends in byte {}",
            data[data.len() - 1]
        );
    }

    #[tokio::test]
    async fn tracks_the_last_line() {
        let mut out = Vec::new();
        let st = pump(&b"a\nb\n"[..], &mut out, None, "stderr")
            .await
            .unwrap();
        assert!(!st.open_line);
        let st = pump(&b""[..], &mut out, None, "stderr").await.unwrap();
        assert!(!st.open_line);
        // Truncated mid-line: the marker ends the line.
        let st = pump(&b"abcdef"[..], &mut out, Some(3), "stderr")
            .await
            .unwrap();
        assert!(!st.open_line);
    }
}
