//! `direct-tcpip` channels (`ssh -L`, `openshell forward start`):
//! loopback targets only, the channel accepted first and then connected, bytes copied both
//! ways with TCP_NODELAY. Remote forwarding (`tcpip-forward`) is refused by the handler.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use russh::Channel;
use russh::server::Msg;

use crate::policy::NetworkMode;

/// Most forwarded channels open at once on one SSH connection. Each holds a socket and a
/// task; a client opening channels in a loop must not exhaust the supervisor's fds.
pub const MAX_FORWARDS: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error("port {0} is out of range")]
    Port(u32),
    #[error("`{0}` is not a loopback address")]
    NotLoopback(String),
    #[error("too many forwarded channels on this connection (the limit is {MAX_FORWARDS})")]
    TooMany,
    /// No sandbox, so no sandbox loopback: connecting anyway would reach the supervisor's.
    #[error("{0}; no forward is connected until a valid policy arrives")]
    Quarantined(String),
    /// `--network none` without a network namespace of the sandbox's own (degraded).
    #[error(
        "the sandbox has no network namespace of its own (degraded) and no TCP (--network none): a forward would reach the supervisor's loopback"
    )]
    NoNetwork,
}

/// Where a `direct-tcpip` request may connect: `host` must name loopback (`localhost` in any
/// case, 127.0.0.0/8, `::1` in any spelling, `::ffff:127.x.x.x`, optionally in brackets).
/// Names other than `localhost` are never resolved: what a name resolves to is not ours to
/// trust, and the answer could be anything but loopback.
pub fn target(host: &str, port: u32) -> Result<SocketAddr, ForwardError> {
    let port = u16::try_from(port).map_err(|_| ForwardError::Port(port))?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip = if bare.eq_ignore_ascii_case("localhost") {
        // Pinned to the IPv4 loopback instead of asking the resolver, which may answer ::1
        // first where the service listens on 127.0.0.1 only (the CLI forwards to 127.0.0.1).
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        match bare.parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) if v4.is_loopback() => IpAddr::V4(v4),
            Ok(IpAddr::V6(v6)) if v6.is_loopback() => IpAddr::V6(v6),
            // An IPv4-mapped loopback is the IPv4 loopback; connect to that directly.
            Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) if v4.is_loopback() => IpAddr::V4(v4),
                _ => return Err(ForwardError::NotLoopback(host.to_owned())),
            },
            _ => return Err(ForwardError::NotLoopback(host.to_owned())),
        }
    };
    Ok(SocketAddr::new(ip, port))
}

/// The sandbox a forward connects in. The supervisor's own network namespace (the pod's, or
/// the host's) is never a stand-in for the sandbox's: while the policy is quarantined there
/// is no sandbox and no forward; with `--network none` but no namespace of its own
/// (degraded) the sandbox cannot have a TCP server anywhere, so there is nothing of its to
/// forward to. With `--network all` the sandbox shares our namespace, and so does a forward.
pub fn view(
    slot: &crate::gateway::policy_plane::PolicySlot,
) -> Result<crate::exec::Sandbox, ForwardError> {
    let sandbox = slot
        .ready()
        .map_err(|e| ForwardError::Quarantined(e.to_string()))?;
    if sandbox.net_namespace().is_none() && sandbox.policy().network == NetworkMode::None {
        return Err(ForwardError::NoNetwork);
    }
    Ok(sandbox)
}

/// Connect to `addr` inside the sandbox's network view: with a network namespace of its own,
/// a short-lived thread joins it (setns) and connects there, so that "loopback" is the
/// sandbox's loopback, where its execs' servers listen, never the supervisor's. A socket keeps
/// the namespace it was made in, so the thread may end right after. A fresh thread and never a
/// pool thread: a pooled thread would stay in the sandbox's namespace for whatever it runs
/// next. Without a namespace of its own (`--network all`; [`view`] refuses `--network none`
/// without one) the sandbox shares ours.
pub fn connect_in_view(addr: SocketAddr, sandbox: crate::exec::Sandbox) -> io::Result<TcpStream> {
    use std::os::fd::AsRawFd;
    if sandbox.net_namespace().is_none() {
        return TcpStream::connect(addr);
    }
    std::thread::Builder::new()
        .name("forward-connect".into())
        .spawn(move || {
            let fd = sandbox.net_namespace().expect("checked above").as_raw_fd();
            // SAFETY: setns on a namespace fd the sandbox keeps open for its whole life; it
            // changes only this thread's network namespace.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            TcpStream::connect(addr)
        })?
        .join()
        .map_err(|_| io::Error::other("the forward connect thread panicked"))?
}

/// [`connect_in_view`] off the async workers, made ready for tokio (TCP_NODELAY,
/// non-blocking): for `direct-tcpip` and for the gateway's TCP relay targets alike.
pub async fn connect(
    addr: SocketAddr,
    sandbox: crate::exec::Sandbox,
) -> io::Result<tokio::net::TcpStream> {
    let tcp = tokio::task::spawn_blocking(move || connect_in_view(addr, sandbox))
        .await
        .map_err(|e| io::Error::other(format!("the forward connect task failed: {e}")))??;
    setup(tcp)
}

/// One slot of the per-connection cap; released when dropped.
pub struct Slot(Arc<AtomicUsize>);

/// Take a slot, or fail when [`MAX_FORWARDS`] are in use.
pub fn take_slot(open: &Arc<AtomicUsize>) -> Result<Slot, ForwardError> {
    open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
        (n < MAX_FORWARDS).then_some(n + 1)
    })
    .map(|_| Slot(open.clone()))
    .map_err(|_| ForwardError::TooMany)
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serve an accepted `direct-tcpip` channel: connect, then copy until both sides are done.
/// A failed connect closes the channel (the client already has it open, as upstream does).
pub fn spawn(channel: Channel<Msg>, addr: SocketAddr, slot: Slot, sandbox: crate::exec::Sandbox) {
    tokio::spawn(async move {
        let _slot = slot;
        let mut tcp = match connect(addr, sandbox).await {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(%addr, "forwarded connection failed: {e}");
                let _ = channel.close().await;
                return;
            }
        };
        let mut stream = channel.into_stream();
        match tokio::io::copy_bidirectional(&mut tcp, &mut stream).await {
            Ok((up, down)) => tracing::debug!(%addr, up, down, "forwarded connection done"),
            Err(e) => tracing::debug!(%addr, "forwarded connection ended: {e}"),
        }
    });
}

fn setup(tcp: TcpStream) -> io::Result<tokio::net::TcpStream> {
    // Interactive protocols over a forward (a REPL, a debugger) must not wait on Nagle.
    tcp.set_nodelay(true)?;
    tcp.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(tcp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_targets_are_allowed() {
        let v4 = |a: &str, p| SocketAddr::new(a.parse().unwrap(), p);
        assert_eq!(target("localhost", 80), Ok(v4("127.0.0.1", 80)));
        assert_eq!(target("LocalHost", 80), Ok(v4("127.0.0.1", 80)));
        assert_eq!(target("[localhost]", 80), Ok(v4("127.0.0.1", 80)));
        assert_eq!(target("127.0.0.1", 8080), Ok(v4("127.0.0.1", 8080)));
        assert_eq!(target("127.255.3.4", 1), Ok(v4("127.255.3.4", 1)));
        assert_eq!(target("::1", 22), Ok(v4("::1", 22)));
        assert_eq!(target("[::1]", 22), Ok(v4("::1", 22)));
        assert_eq!(target("0:0:0:0:0:0:0:1", 22), Ok(v4("::1", 22)));
        assert_eq!(target("::ffff:127.0.0.9", 5), Ok(v4("127.0.0.9", 5)));
        assert_eq!(target("[::ffff:127.0.0.9]", 5), Ok(v4("127.0.0.9", 5)));
        assert_eq!(target("127.0.0.1", 65535), Ok(v4("127.0.0.1", 65535)));
        for bad in [
            "10.0.0.1",
            "0.0.0.0",
            "::",
            "::ffff:10.0.0.1",
            "example.com",
            "localhost.",
            "127.1",
            "[127.0.0.1",
            "",
            "169.254.169.254",
        ] {
            assert_eq!(
                target(bad, 80),
                Err(ForwardError::NotLoopback(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(target("127.0.0.1", 65536), Err(ForwardError::Port(65536)));
    }

    #[test]
    fn the_cap_is_enforced_and_released() {
        let open = Arc::new(AtomicUsize::new(0));
        let slots: Vec<_> = (0..MAX_FORWARDS)
            .map(|_| take_slot(&open).unwrap())
            .collect();
        assert_eq!(take_slot(&open).err(), Some(ForwardError::TooMany));
        drop(slots);
        assert!(take_slot(&open).is_ok());
    }
}
