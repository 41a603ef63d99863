//! The `openshell-main` subsystem: a session channel attached to the
//! canonical main process. Output is replayed from the oldest retained event, then live;
//! input goes to the main process only from the lease holder; Ctrl-P Ctrl-Q detaches.
//!
//! Nothing here ever closes the main process's stdin or ends it: a detach, an eof, a close
//! or a dropped connection only ends this attachment.

use bytes::Bytes;
use russh::server::Msg;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Sig};

use crate::gateway::exec_service::ExecContext;
use crate::gateway::main_attach::{Event, Next};

/// The subsystem name `openshell sandbox connect` asks for.
pub const NAME: &str = "openshell-main";
/// The `env` request that attaches read-only (exact value `1`).
pub const READ_ONLY_ENV: &str = "OPENSHELL_MAIN_READ_ONLY";

const CTRL_P: u8 = 0x10;
const CTRL_Q: u8 = 0x11;

/// The Ctrl-P Ctrl-Q detach sequence, found across data frames.
#[derive(Default)]
struct Detach {
    /// The last frame ended with a Ctrl-P whose fate depends on the next byte.
    held: bool,
}

impl Detach {
    /// The bytes of `data` to forward, and whether the sequence was completed (bytes after it
    /// are dropped). A Ctrl-P followed by anything else is forwarded together with that byte.
    fn scan(&mut self, data: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(data.len() + 1);
        for &b in data {
            if self.held {
                self.held = false;
                if b == CTRL_Q {
                    return (out, true);
                }
                out.extend_from_slice(&[CTRL_P, b]);
            } else if b == CTRL_P {
                self.held = true;
            } else {
                out.push(b);
            }
        }
        (out, false)
    }
}

/// The signals an attacher may send to the main process group; others are ignored.
fn signal_number(s: &Sig) -> Option<i32> {
    Some(match s {
        Sig::HUP => libc::SIGHUP,
        Sig::INT => libc::SIGINT,
        Sig::KILL => libc::SIGKILL,
        Sig::QUIT => libc::SIGQUIT,
        Sig::TERM => libc::SIGTERM,
        _ => return None,
    })
}

/// How the input side of an attachment ended.
enum Ended {
    /// The output side finished (exit published, fell behind, or the channel is gone).
    Output,
    Detached,
    QueueFull,
    /// The client closed the channel or the connection dropped.
    Gone,
}

async fn stderr_line(wr: &ChannelWriteHalf<Msg>, line: &str, nl: &str) {
    let _ = wr
        .extended_data_bytes(1, Bytes::from(format!("{line}{nl}")))
        .await;
}

/// Serve one attachment until it ends. `pty` is the size from a `pty-req` before the
/// subsystem request; `read_only` is `env OPENSHELL_MAIN_READ_ONLY=1`.
pub async fn serve(
    ctx: &ExecContext,
    rd: &mut ChannelReadHalf,
    wr: &ChannelWriteHalf<Msg>,
    pty: Option<(u32, u32)>,
    read_only: bool,
) {
    // A terminal in raw mode (ssh -t) needs the carriage return.
    let nl = if pty.is_some() { "\r\n" } else { "\n" };
    let Some(main) = ctx.main.get().cloned() else {
        stderr_line(
            wr,
            "openshell: this sandbox has no canonical main process",
            nl,
        )
        .await;
        let _ = wr.eof().await;
        let _ = wr.exit_status(1).await;
        let _ = wr.close().await;
        return;
    };
    if let Some((cols, rows)) = pty {
        main.resize(cols, rows);
    }
    let (mut lease, mut cursor) = main.attach(read_only);
    tracing::info!(
        attacher = lease.id,
        owner = lease.owner,
        "attached to the main process"
    );
    if !read_only && !lease.owner {
        stderr_line(
            wr,
            "openshell: canonical main process already has an input owner; attached read-only",
            nl,
        )
        .await;
    }
    let ended = {
        let output = async {
            loop {
                match main.next(&mut cursor).await {
                    Next::Event(Event::Stdout(b)) => {
                        if wr.data_bytes(b).await.is_err() {
                            return;
                        }
                    }
                    Next::Event(Event::Stderr(b)) => {
                        if wr.extended_data_bytes(1, b).await.is_err() {
                            return;
                        }
                    }
                    Next::Event(Event::Exit(code)) => {
                        let _ = wr.eof().await;
                        let _ = wr.exit_status(code.max(0) as u32).await;
                        let _ = wr.close().await;
                        return;
                    }
                    Next::FellBehind(n) => {
                        stderr_line(wr, &format!("openshell: attachment fell behind by {n} output chunks; reconnect for buffered output"), nl).await;
                        let _ = wr.close().await;
                        return;
                    }
                }
            }
        };
        let input = async {
            let mut detach = Detach::default();
            let mut input_open = true;
            loop {
                match rd.wait().await {
                    None | Some(ChannelMsg::Close) => return Ended::Gone,
                    Some(ChannelMsg::Data { data }) if input_open => {
                        let (fwd, detached) = detach.scan(&data);
                        if !fwd.is_empty() && main.input(&lease, Bytes::from(fwd)).is_err() {
                            return Ended::QueueFull;
                        }
                        if detached {
                            return Ended::Detached;
                        }
                    }
                    Some(ChannelMsg::Eof) => {
                        // Stops this attacher's input only; output keeps flowing.
                        main.release(&mut lease);
                        input_open = false;
                    }
                    Some(ChannelMsg::WindowChange {
                        col_width,
                        row_height,
                        ..
                    }) => main.resize(col_width, row_height),
                    Some(ChannelMsg::Signal { signal }) => match signal_number(&signal) {
                        Some(sig) => main.signal(sig),
                        None => tracing::debug!(?signal, "signal request ignored"),
                    },
                    Some(_) => {}
                }
            }
        };
        tokio::pin!(output, input);
        tokio::select! {
            _ = &mut output => Ended::Output,
            e = &mut input => e,
        }
    };
    main.release(&mut lease);
    let tail = |line: Option<&'static str>| async move {
        if let Some(l) = line {
            stderr_line(wr, l, nl).await;
        }
        let _ = wr.eof().await;
        let _ = wr.exit_status(0).await;
        let _ = wr.close().await;
    };
    match ended {
        Ended::Detached => tail(None).await,
        Ended::QueueFull => {
            tail(Some(
                "openshell: canonical stdin buffer is full; closing attachment",
            ))
            .await
        }
        Ended::Output | Ended::Gone => {}
    }
    tracing::info!(attacher = lease.id, "detached from the main process");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_p_ctrl_q_detaches_and_drops_what_follows() {
        let mut d = Detach::default();
        assert_eq!(d.scan(b"ab\x10\x11cd"), (b"ab".to_vec(), true));
    }

    #[test]
    fn the_pair_is_found_across_frames() {
        let mut d = Detach::default();
        assert_eq!(d.scan(b"ab\x10"), (b"ab".to_vec(), false));
        assert_eq!(d.scan(b"\x11zz"), (Vec::new(), true));
    }

    #[test]
    fn ctrl_p_then_another_byte_is_forwarded_together() {
        let mut d = Detach::default();
        assert_eq!(d.scan(b"\x10"), (Vec::new(), false));
        assert_eq!(d.scan(b"x"), (b"\x10x".to_vec(), false));
        assert_eq!(d.scan(b"\x10\x10\x11"), (b"\x10\x10\x11".to_vec(), false));
    }
}
