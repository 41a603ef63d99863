//! The running canonical main process as attachers see it: the
//! retained output log, the single input lease, the bounded stdin queue, the pty size and
//! signals to the process group. The SSH side (`ssh::main_subsystem`) only maps channel messages
//! onto this.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::exec::pty;

/// Output bytes retained for replay (OpenShell's `OUTPUT_BUFFER_BYTES`).
pub const OUTPUT_BUFFER_BYTES: usize = 1 << 20;
/// Output is read, stored and evicted in pieces of at most this size.
pub const CHUNK: usize = 4096;
/// Writes queued towards the main process's stdin before an attacher is cut off.
pub const STDIN_QUEUE: usize = 64;

/// One retained event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Everything from a pty, or the stdout pipe.
    Stdout(Bytes),
    /// The stderr pipe (never with a pty).
    Stderr(Bytes),
    /// The main process ended with this code (128+N for signal N, 124 for `--timeout`).
    Exit(i32),
}

impl Event {
    fn len(&self) -> usize {
        match self {
            Event::Stdout(b) | Event::Stderr(b) => b.len(),
            Event::Exit(_) => 0,
        }
    }
}

/// What an attacher gets next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Event(Event),
    /// The attacher's cursor points before the oldest retained event: this many chunks were
    /// evicted before it read them.
    FellBehind(u64),
}

/// Output events in order; `first` is the sequence number of `events[0]`.
#[derive(Default)]
struct Log {
    events: VecDeque<Event>,
    first: u64,
    bytes: usize,
}

impl Log {
    fn push(&mut self, ev: Event, limit: usize) {
        self.bytes += ev.len();
        self.events.push_back(ev);
        // Oldest output goes first, whole. The exit event is the last one ever pushed and
        // carries no bytes, so eviction never reaches it.
        while self.bytes > limit {
            match self.events.front() {
                Some(Event::Exit(_)) | None => break,
                Some(_) => {
                    let ev = self.events.pop_front().expect("front exists");
                    self.bytes -= ev.len();
                    self.first += 1;
                }
            }
        }
    }

    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

/// Why an input write was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum InputError {
    /// The stdin queue holds [`STDIN_QUEUE`] writes already.
    Full,
}

/// Shared by the process's owner task, its output readers and every attachment.
pub struct MainSession {
    log: Mutex<Log>,
    limit: usize,
    /// The end sequence number of the log, bumped at every push; attachers wait on it.
    changed: watch::Sender<u64>,
    lease: Mutex<Option<u64>>,
    next_id: AtomicU64,
    stdin: mpsc::Sender<Bytes>,
    pty: Option<Arc<pty::Master>>,
    signals: mpsc::UnboundedSender<i32>,
}

/// One attacher's side of the input lease.
pub struct Lease {
    pub id: u64,
    /// Holds the input lease.
    pub owner: bool,
}

/// One attacher's position in the output log.
pub struct Cursor {
    seq: u64,
    changed: watch::Receiver<u64>,
}

impl MainSession {
    /// `stdin` is the queue the process's stdin writer drains; `signals` goes to the task
    /// that owns the child (only it knows whether the process group still belongs to us).
    pub fn new(
        stdin: mpsc::Sender<Bytes>,
        pty: Option<Arc<pty::Master>>,
        signals: mpsc::UnboundedSender<i32>,
    ) -> Arc<MainSession> {
        Self::with_limit(stdin, pty, signals, OUTPUT_BUFFER_BYTES)
    }

    fn with_limit(
        stdin: mpsc::Sender<Bytes>,
        pty: Option<Arc<pty::Master>>,
        signals: mpsc::UnboundedSender<i32>,
        limit: usize,
    ) -> Arc<MainSession> {
        Arc::new(MainSession {
            log: Mutex::new(Log::default()),
            limit,
            changed: watch::channel(0).0,
            lease: Mutex::new(None),
            next_id: AtomicU64::new(1),
            stdin,
            pty,
            signals,
        })
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lease(&self) -> MutexGuard<'_, Option<u64>> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_tty(&self) -> bool {
        self.pty.is_some()
    }

    /// Retain an output or exit event and wake every attacher.
    pub fn push(&self, ev: Event) {
        let end = {
            let mut log = self.log();
            log.push(ev, self.limit);
            log.end()
        };
        self.changed.send_replace(end);
    }

    /// Attach at the oldest retained event. The first attacher that is not read-only while
    /// the lease is free becomes the input owner.
    pub fn attach(&self, read_only: bool) -> (Lease, Cursor) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let owner = !read_only && {
            let mut lease = self.lease();
            lease.is_none() && {
                *lease = Some(id);
                true
            }
        };
        let changed = self.changed.subscribe();
        let seq = self.log().first;
        (Lease { id, owner }, Cursor { seq, changed })
    }

    /// Give up the lease if `a` holds it. Read-only attachers are not promoted.
    pub fn release(&self, a: &mut Lease) {
        if a.owner {
            let mut lease = self.lease();
            if *lease == Some(a.id) {
                *lease = None;
            }
            a.owner = false;
        }
    }

    /// The next event at `c`, waiting for live output once the replay is done. Cancel-safe.
    pub async fn next(&self, c: &mut Cursor) -> Next {
        loop {
            c.changed.borrow_and_update();
            {
                let log = self.log();
                if c.seq < log.first {
                    return Next::FellBehind(log.first - c.seq);
                }
                if let Some(ev) = log.events.get((c.seq - log.first) as usize) {
                    c.seq += 1;
                    return Next::Event(ev.clone());
                }
            }
            // The sender lives as long as `self`, so this only waits.
            let _ = c.changed.changed().await;
        }
    }

    /// Queue input from `a`. Input from anyone but the lease holder is dropped silently.
    pub fn input(&self, a: &Lease, data: Bytes) -> Result<(), InputError> {
        if !a.owner || data.is_empty() {
            return Ok(());
        }
        match self.stdin.try_send(data) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => Err(InputError::Full),
            // The writer stopped (the process is gone): nothing to feed.
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
        }
    }

    /// Resize the main pty (shared by every attacher); nothing for pipes.
    pub fn resize(&self, cols: u32, rows: u32) {
        if let Some(m) = &self.pty
            && let Err(e) = m.resize(cols, rows)
        {
            tracing::debug!("resizing the main process pty: {e}");
        }
    }

    /// Send `sig` to the main process group.
    pub fn signal(&self, sig: i32) {
        let _ = self.signals.send(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(limit: usize) -> (Arc<MainSession>, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(STDIN_QUEUE);
        let (stx, _srx) = mpsc::unbounded_channel();
        (MainSession::with_limit(tx, None, stx, limit), rx)
    }

    fn out(s: &str) -> Event {
        Event::Stdout(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[tokio::test]
    async fn replay_starts_at_the_oldest_retained_event_and_keeps_the_exit() {
        let (s, _rx) = session(8);
        s.push(out("aaaa"));
        s.push(out("bbbb"));
        s.push(out("cccc")); // evicts "aaaa" whole
        s.push(Event::Exit(3));
        let (_, mut c) = s.attach(true);
        assert_eq!(s.next(&mut c).await, Next::Event(out("bbbb")));
        assert_eq!(s.next(&mut c).await, Next::Event(out("cccc")));
        assert_eq!(s.next(&mut c).await, Next::Event(Event::Exit(3)));
    }

    #[tokio::test]
    async fn a_cursor_out_of_the_window_fell_behind_by_the_evicted_chunks() {
        let (s, _rx) = session(8);
        let (_, mut c) = s.attach(true);
        for chunk in ["aaaa", "bbbb", "cccc", "dddd"] {
            s.push(out(chunk));
        }
        assert_eq!(s.next(&mut c).await, Next::FellBehind(2));
    }

    #[tokio::test]
    async fn one_input_owner_and_no_promotion() {
        let (s, mut rx) = session(8);
        let (mut first, _) = s.attach(false);
        let (second, _) = s.attach(false);
        assert!(first.owner && !second.owner);
        s.input(&second, Bytes::from_static(b"dropped")).unwrap();
        s.input(&first, Bytes::from_static(b"kept")).unwrap();
        assert_eq!(rx.try_recv().unwrap(), Bytes::from_static(b"kept"));
        assert!(rx.try_recv().is_err());
        s.release(&mut first);
        assert!(!second.owner, "a read-only attacher is never promoted");
        assert!(
            s.attach(false).0.owner,
            "a new attacher takes the free lease"
        );
    }

    #[tokio::test]
    async fn the_queue_holds_64_writes() {
        let (s, _rx) = session(8);
        let (a, _) = s.attach(false);
        for _ in 0..STDIN_QUEUE {
            s.input(&a, Bytes::from_static(b"x")).unwrap();
        }
        assert_eq!(s.input(&a, Bytes::from_static(b"x")), Err(InputError::Full));
    }
}
