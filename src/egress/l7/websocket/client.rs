//! Client to upstream: text messages assembled within [`Limits`] and checked; binary messages
//! and control frames streamed through.

use tokio::io::{AsyncRead, AsyncWrite, ReadHalf};
use tokio::time::Instant;

use super::frame::{ReadError, read_header, read_payload};
use super::frame::{apply_mask, head};
use super::limits::Slot;
use super::parts::{
    BINARY, CLOSE, CONTINUATION, Context, INVALID_PAYLOAD, POLICY_VIOLATION, PROTOCOL_ERROR,
    Shared, Side, TEXT, TOO_BIG, TRY_AGAIN_LATER,
};

/// A text message being assembled: its bytes so far, its fragments, its slot and the end of
/// its total clock.
struct Assembly {
    buf: Vec<u8>,
    fragments: usize,
    slot: Slot,
    deadline: Instant,
}

/// The close for a read that failed inside an assembly.
fn assembly_end(e: ReadError) -> Side {
    match e {
        ReadError::Io => Side::Ended,
        ReadError::TooBig => Side::Code(TOO_BIG),
        ReadError::Idle => Side::Code(POLICY_VIOLATION),
    }
}

pub(super) async fn client_side<C, U>(mut r: ReadHalf<C>, w: Shared<U>, cx: &Context) -> Side
where
    C: AsyncRead,
    U: AsyncWrite,
{
    let lim = &*cx.limits;
    let mut text: Option<Assembly> = None;
    let mut binary_open = false;
    loop {
        // Between the fragments of a text message both its clocks run.
        let h = match &text {
            None => read_header(&mut r, lim.max_frame).await,
            Some(a) => {
                let idle =
                    tokio::time::timeout(lim.assembly_idle, read_header(&mut r, lim.max_frame));
                match tokio::time::timeout_at(a.deadline, idle).await {
                    Ok(Ok(h)) => h,
                    Ok(Err(_)) | Err(_) => return Side::Code(POLICY_VIOLATION),
                }
            }
        };
        let h = match h {
            Ok(Some(h)) => h,
            Ok(None) | Err(ReadError::Io | ReadError::Idle) => return Side::Ended,
            Err(ReadError::TooBig) => return Side::Code(TOO_BIG),
        };
        if !h.masked || h.rsv != 0 {
            return Side::Code(PROTOCOL_ERROR);
        }
        let whole = match (h.opcode, text.is_some(), binary_open) {
            (op, _, _) if op >= CLOSE => {
                // Control frames (close, ping, pong) may come between fragments.
                if !h.fin || h.len > 125 {
                    return Side::Code(PROTOCOL_ERROR);
                }
                if !w.lock().await.pass(&mut r, &h).await {
                    return Side::Ended;
                }
                if op == CLOSE {
                    return Side::Closed;
                }
                None
            }
            (BINARY, false, false) | (CONTINUATION, false, true) => {
                binary_open = !h.fin;
                if !w.lock().await.pass(&mut r, &h).await {
                    return Side::Ended;
                }
                None
            }
            (TEXT, false, false) => {
                if h.len > lim.max_text as u64 {
                    return Side::Code(TOO_BIG);
                }
                // The slot first: no byte of the message is held without one. The wait for it
                // counts against the message's total clock.
                let deadline = Instant::now() + lim.assembly_total;
                let slot = match tokio::time::timeout_at(deadline, lim.assemblies.enter()).await {
                    Ok(Ok(slot)) => slot,
                    Ok(Err(_)) | Err(_) => return Side::Code(TRY_AGAIN_LATER),
                };
                let mut a = Assembly {
                    buf: Vec::new(),
                    fragments: 1,
                    slot,
                    deadline,
                };
                let read = read_payload(&mut r, &h, &mut a.buf, lim.assembly_idle);
                match tokio::time::timeout_at(deadline, read).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return assembly_end(e),
                    Err(_) => return Side::Code(POLICY_VIOLATION),
                }
                if h.fin {
                    Some(a)
                } else {
                    text = Some(a);
                    None
                }
            }
            (CONTINUATION, true, _) => {
                let Some(a) = text.as_mut() else {
                    return Side::Code(PROTOCOL_ERROR);
                };
                // Checked before the buffer grows: it never holds more than the limit.
                a.fragments += 1;
                if a.buf.len() as u64 + h.len > lim.max_text as u64
                    || a.fragments > lim.max_fragments
                {
                    return Side::Code(TOO_BIG);
                }
                let read = read_payload(&mut r, &h, &mut a.buf, lim.assembly_idle);
                match tokio::time::timeout_at(a.deadline, read).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return assembly_end(e),
                    Err(_) => return Side::Code(POLICY_VIOLATION),
                }
                if h.fin { text.take() } else { None }
            }
            _ => return Side::Code(PROTOCOL_ERROR),
        };
        let Some(Assembly { buf: msg, slot, .. }) = whole else {
            continue;
        };
        if std::str::from_utf8(&msg).is_err() {
            return Side::Code(INVALID_PAYLOAD);
        }
        // Text messages are not rewritten: a placeholder in one would leave as it is.
        if super::super::super::credentials::has_marker(&msg) || cx.check().is_err() {
            return Side::Code(POLICY_VIOLATION);
        }
        // Masked in place: the message is never held twice.
        let mut msg = msg;
        let key: [u8; 4] = rand::random();
        apply_mask(&mut msg, key);
        let head = head(true, TEXT, msg.len(), Some(key));
        let sent = async { w.lock().await.send(&head, &msg).await };
        match tokio::time::timeout(lim.forward_total, sent).await {
            Ok(true) => {}
            // An upstream that does not take the message within the forward clock: the frame
            // stays part-written, so the relay only shuts both sides down.
            Ok(false) | Err(_) => return Side::Ended,
        }
        // The slot is held until the message has left: its bytes were ours until then.
        drop((msg, slot));
    }
}
