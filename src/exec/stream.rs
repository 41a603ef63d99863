//! Streaming a child's output: copy as it arrives, never hold more than one buffer, and past
//! the cap keep draining (so the child is never blocked on a full pipe) while discarding.
//!
//! Two events go back to the run loop (see [`Event`]): the cap was reached (for
//! `--on-output-limit kill`), and whoever reads our side went away. On the latter the pump
//! stops reading and drops its end of the child's pipe, so the child's next write fails with
//! EPIPE (SIGPIPE by default), as in a shell pipeline; a child that ignores that is stopped by
//! the run loop.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedSender;

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
    /// Our reader went away (EPIPE on our side); the pump stopped reading.
    #[serde(skip)]
    pub reader_gone: bool,
}

/// What a pump tells the run loop while the child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The stream reached `--max-output`.
    OutputLimit,
    /// Writing our side failed: nobody reads it any more.
    ReaderGone,
}

/// How one stream is copied.
#[derive(Debug, Clone)]
pub struct Options {
    /// At most this many bytes are forwarded, then a marker line ends the output.
    pub cap: Option<u64>,
    /// The stream's name in the marker.
    pub name: &'static str,
    /// Where [`Event`]s go (none: nobody listens).
    pub events: Option<UnboundedSender<Event>>,
}

impl Options {
    pub fn new(cap: Option<u64>, name: &'static str) -> Options {
        Options {
            cap,
            name,
            events: None,
        }
    }

    fn send(&self, ev: Event) {
        if let Some(tx) = &self.events {
            let _ = tx.send(ev);
        }
    }
}

const CHUNK: usize = 64 * 1024;

/// The longest prefix of `data[..end]` that does not end inside a UTF-8 sequence: a lead
/// byte in the last three whose sequence would run past `end` is cut off with its
/// continuation bytes. Bytes that are not UTF-8 at all are left alone.
fn utf8_floor(data: &[u8], end: usize) -> usize {
    let lo = end.saturating_sub(3);
    for i in (lo..end).rev() {
        let b = data[i];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        let len = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if i + len > end { i } else { end };
    }
    end
}

/// Copy `r` to `w` until EOF, or until `w` fails with EPIPE (our reader went away: then `r`
/// is dropped at once, and the child sees EPIPE). With a cap, at most `cap` bytes are forwarded, cut
/// back so no UTF-8 sequence is split, then a marker on a line of its own names the stream;
/// the rest is drained and discarded.
pub async fn pump<R, W>(mut r: R, w: &mut W, opts: Options) -> io::Result<StreamStats>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    // Bytes of an incomplete UTF-8 sequence held back from the end of the last read (at most
    // 3, only with a cap): the cap must not fall inside a character split across two reads.
    let mut held = 0usize;
    let mut st = StreamStats::default();
    // Our side failed with something other than EPIPE (EBADF for a closed fd, ENOSPC on
    // /dev/full, EIO on a hung-up terminal): a shell child would see that error and go on, so
    // we keep draining (the child is never blocked) and discard.
    let mut writer_ok = true;
    loop {
        let n = match r.read(&mut buf[held..]).await {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let eof = n == 0;
        st.bytes += n as u64;
        if st.truncated {
            if eof {
                break;
            }
            continue; // drain and discard
        }
        let len = held + n;
        let (take, cut) = match opts.cap {
            None => (len, false),
            Some(c) => {
                let room = c.saturating_sub(st.forwarded);
                if len as u64 > room {
                    (utf8_floor(&buf, room as usize), true)
                } else if eof {
                    (len, false)
                } else {
                    (utf8_floor(&buf, len), false)
                }
            }
        };
        if take > 0 && writer_ok {
            match w.write_all(&buf[..take]).await {
                Ok(()) => {
                    st.forwarded += take as u64;
                    st.open_line = buf[take - 1] != b'\n';
                }
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                    return Ok(reader_gone(st, e, &opts));
                }
                Err(e) => {
                    tracing::debug!(stream = opts.name, error = %e, "writing our side failed; discarding");
                    writer_ok = false;
                }
            }
        }
        if cut {
            st.truncated = true;
            opts.send(Event::OutputLimit);
            held = 0;
        } else {
            buf.copy_within(take..len, 0);
            held = len - take;
        }
        if eof {
            break;
        }
    }
    if !writer_ok {
        return Ok(st);
    }
    if st.truncated {
        // On a line of its own, and no empty line when the cut fell after a newline.
        let nl = if st.open_line { "\n" } else { "" };
        let marker = format!(
            "{nl}[openshell-sandbox: {} truncated: {} of {} bytes shown (--max-output)]\n",
            opts.name, st.forwarded, st.bytes
        );
        if w.write_all(marker.as_bytes()).await.is_err() {
            return Ok(st); // the child has ended: nothing left to close
        }
        st.open_line = false;
    }
    let _ = w.flush().await;
    Ok(st)
}

fn reader_gone(mut st: StreamStats, e: io::Error, opts: &Options) -> StreamStats {
    tracing::debug!(stream = opts.name, error = %e, "our reader went away; closing the child's pipe");
    st.reader_gone = true;
    opts.send(Event::ReaderGone);
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn capped(data: &[u8], cap: Option<u64>) -> (Vec<u8>, StreamStats) {
        let mut out = Vec::new();
        let st = pump(data, &mut out, Options::new(cap, "stdout"))
            .await
            .unwrap();
        (out, st)
    }

    #[tokio::test]
    async fn caps_and_marks() {
        let data = vec![b'x'; 300_000];
        let (out, st) = capped(&data, Some(1000)).await;
        assert_eq!(st.bytes, 300_000);
        assert_eq!(st.forwarded, 1000);
        assert!(st.truncated);
        let text = String::from_utf8_lossy(&out[1000..]).into_owned();
        assert!(
            text.starts_with("\n[openshell-sandbox: stdout truncated: 1000 of 300000 bytes"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn no_cap_copies_everything() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let (out, st) = capped(&data, None).await;
        assert_eq!(out, data);
        assert!(!st.truncated);
        assert!(st.open_line);
    }

    #[tokio::test]
    async fn binary_under_the_cap_is_copied_exactly() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let (out, st) = capped(&data, Some(1 << 20)).await;
        assert_eq!(out, data);
        assert!(!st.truncated);
    }

    #[tokio::test]
    async fn the_cut_never_splits_a_character() {
        let (out, _) = capped("abéé".as_bytes(), Some(5)).await;
        assert!(
            out.starts_with("abé\n[openshell-sandbox".as_bytes()),
            "{out:?}"
        );
        let (out, _) = capped("a€".as_bytes(), Some(3)).await;
        assert!(out.starts_with(b"a\n["), "{out:?}");
        let (out, _) = capped("abc\ndef".as_bytes(), Some(4)).await;
        assert!(out.starts_with(b"abc\n[openshell"), "{out:?}");
    }

    #[test]
    fn utf8_floor_cases() {
        let s = "a€b".as_bytes(); // 61 e2 82 ac 62
        assert_eq!(utf8_floor(s, 1), 1);
        assert_eq!(utf8_floor(s, 2), 1);
        assert_eq!(utf8_floor(s, 3), 1);
        assert_eq!(utf8_floor(s, 4), 4);
        assert_eq!(utf8_floor(&[0x80, 0x80, 0x80, 0x80], 4), 4);
    }

    #[tokio::test]
    async fn tracks_the_last_line() {
        let (_, st) = capped(b"a\nb\n", None).await;
        assert!(!st.open_line);
        let (_, st) = capped(b"", None).await;
        assert!(!st.open_line);
        let (_, st) = capped(b"abcdef", Some(3)).await;
        assert!(!st.open_line);
    }
}
