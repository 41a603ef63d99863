//! What one WebSocket relay may hold, and what the whole proxy may: a client text message is
//! the only thing read whole (it is checked before it goes on), so its size, its fragments and
//! its time are bounded per message, and the messages being assembled at once are bounded
//! proxy-wide. Everything else is streamed through in bounded chunks (`frame.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The limits of the WebSocket relays of one proxy (OpenShell's values by default).
#[derive(Debug)]
pub struct Limits {
    /// A client text message, assembled, at most this long (1009 past it).
    pub max_text: usize,
    /// One frame's payload at most, either way (1009 past it).
    pub max_frame: u64,
    /// Fragments of one text message at most (1009 past it).
    pub max_fragments: usize,
    /// A text message being assembled closes (1008) after this without a byte of it.
    pub assembly_idle: Duration,
    /// ... or this long after its first frame, however it trickles.
    pub assembly_total: Duration,
    /// An assembled message must be written upstream within this.
    pub forward_total: Duration,
    /// Text messages being assembled at once, proxy-wide.
    pub assemblies: Assemblies,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_text: 4 << 20,
            max_frame: 16 << 20,
            max_fragments: 4096,
            assembly_idle: Duration::from_secs(30),
            assembly_total: Duration::from_secs(120),
            forward_total: Duration::from_secs(120),
            assemblies: Assemblies::new(32, 64),
        }
    }
}

/// The proxy-wide slots of text assembly: at most `slots` held, at most `queue` waiting for
/// one; past that a new message is refused (1013, try again later).
#[derive(Debug)]
pub struct Assemblies {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    queue: usize,
}

/// A slot of [`Assemblies`], held while a text message is read, checked and sent on.
#[derive(Debug)]
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

/// Every slot is held and the queue is full.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

/// Counts one waiter while it waits (a waiter whose relay ends is uncounted by its drop).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Assemblies {
    pub fn new(slots: usize, queue: usize) -> Assemblies {
        Assemblies {
            slots: Arc::new(Semaphore::new(slots)),
            waiting: AtomicUsize::new(0),
            queue,
        }
    }

    /// A slot: at once if one is free, after a wait in the queue if there is room in it.
    pub async fn enter(&self) -> Result<Slot, Full> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot(p));
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Full);
        }
        let _w = Waiting(&self.waiting);
        match self.slots.clone().acquire_owned().await {
            Ok(p) => Ok(Slot(p)),
            Err(_) => Err(Full),
        }
    }

    /// Slots held right now.
    pub fn held(&self, of: usize) -> usize {
        of - self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_then_a_queue_then_full() {
        let a = Arc::new(Assemblies::new(2, 1));
        let s1 = a.enter().await.unwrap();
        let _s2 = a.enter().await.unwrap();
        assert_eq!(a.held(2), 2);
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.enter().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The queue (one) is taken: the next is refused at once.
        assert_eq!(a.enter().await.unwrap_err(), Full);
        drop(s1);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        // The waiter's slot went back with it, and the queue is empty again.
        assert_eq!(a.held(2), 1);
        let _s3 = a.enter().await.unwrap();
        let a3 = a.clone();
        let w = tokio::spawn(async move { a3.enter().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.abort();
        let _ = w.await;
        // An abandoned waiter leaves the queue.
        let a4 = a.clone();
        let w = tokio::spawn(async move { a4.enter().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!w.is_finished(), "queued, not refused");
        w.abort();
    }
}
