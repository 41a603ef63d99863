//! The end of an inspected tunnel: the relay may answer before it has read a request's body
//! (a 413, a deny), and closing a socket with bytes still unread makes the kernel send a reset,
//! which a client still sending sees instead of the answer. So the tunnel keeps its own hold
//! on the client's socket, and once the relay is done it shuts the sending side and reads and
//! drops what still comes, for a bounded time and amount, before the socket closes.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::super::relay::End;

/// How long a finished tunnel reads what its client still sends.
pub const LINGER: Duration = Duration::from_secs(2);
/// ... and how much at most.
pub const LINGER_BYTES: usize = 4 << 20;

/// A second hold on a tunnel's client socket, taken before the relay owns it; `None` if the
/// descriptor could not be duplicated (then the tunnel ends as before).
pub struct Hold(Option<OwnedFd>);

impl Hold {
    pub fn of(client: &TcpStream) -> Hold {
        Hold(client.as_fd().try_clone_to_owned().ok())
    }

    /// `end`, after the release when the relay finished on its own ([`End::Done`]); a tunnel
    /// ended by the policy, the idle clock or the proxy's shutdown closes at once.
    pub async fn after(self, end: End) -> End {
        if matches!(end, End::Done) {
            self.release().await;
        }
        end
    }

    /// Shut the sending side (the client sees the end of the answer), then read and drop what
    /// the client still sends until it closes, [`LINGER`] passes or [`LINGER_BYTES`] came.
    pub async fn release(self) {
        let Some(fd) = self.0 else { return };
        let std = std::net::TcpStream::from(fd);
        if std.set_nonblocking(true).is_err() {
            return;
        }
        let _ = std.shutdown(std::net::Shutdown::Write);
        let Ok(mut s) = TcpStream::from_std(std) else {
            return;
        };
        let drain = async {
            let mut buf = vec![0u8; 16 * 1024];
            let mut left = LINGER_BYTES;
            while left > 0 {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }
}
