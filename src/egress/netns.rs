//! The proxy's sockets inside the sandbox's network namespace.
//!
//! The sandbox's namespace has only `lo`. The proxy's address ([`PROXY_ADDR`], the one
//! OpenShell's sandboxes know) is added to that `lo` as a /32 of host scope, and the listener
//! bound there, from a short-lived thread that joined the namespace: a socket keeps the
//! namespace it was made in, so the thread may end at once and the proxy accepts and dials
//! from the supervisor's own namespace. Nothing routes anywhere else, so any other
//! destination stays ENETUNREACH inside the sandbox. A `NETLINK_SOCK_DIAG` socket is made
//! there too: it is how the proxy finds the client socket of a connection
//! ([`super::procfs`]).
//!
//! A fresh thread and never a pool thread: a pooled thread would stay in the sandbox's
//! namespace for whatever it ran next.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `10.200.0.1:3128`.
pub const PROXY_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 200, 0, 1), 3128);

/// The listen backlog: connections the kernel completes before the proxy accepts them.
const BACKLOG: libc::c_int = 4096;

/// What [`open_in`] made inside the namespace.
pub struct NetnsSockets {
    pub listener: TcpListener,
    /// `None` where the kernel has no `NETLINK_SOCK_DIAG` (then identity falls back to the
    /// namespace's `/proc/<pid>/net/tcp`).
    pub diag: Option<OwnedFd>,
}

/// Why the proxy's sockets could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot start the namespace thread: {0}")]
    Thread(#[source] io::Error),
    #[error("setns into the sandbox's network namespace: {0}")]
    Setns(#[source] io::Error),
    #[error("adding {addr}/32 to lo: {source}")]
    Address {
        addr: Ipv4Addr,
        #[source]
        source: io::Error,
    },
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },
}

/// Make the proxy's listener on `addr` (normally [`PROXY_ADDR`]) inside the network namespace
/// `netns`, adding the address to its `lo` first.
pub fn open_in(netns: BorrowedFd<'_>, addr: SocketAddrV4) -> Result<NetnsSockets, NetnsError> {
    let fd = netns.as_raw_fd();
    // The descriptor is borrowed for the whole call: the thread is joined before we return.
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("egress-netns".into())
            .spawn_scoped(s, move || {
                // SAFETY: setns on a namespace descriptor the caller keeps open; it changes only
                // this thread's network namespace, and the thread ends right after.
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                    return Err(NetnsError::Setns(io::Error::last_os_error()));
                }
                open_here(addr)
            })
            .map_err(NetnsError::Thread)?
            .join()
            .unwrap_or_else(|_| Err(NetnsError::Thread(io::Error::other("panicked"))))
    })
}

/// [`open_in`] for the calling thread's own namespace.
pub fn open_here(addr: SocketAddrV4) -> Result<NetnsSockets, NetnsError> {
    add_loopback_address(*addr.ip()).map_err(|source| NetnsError::Address {
        addr: *addr.ip(),
        source,
    })?;
    let listener = TcpListener::bind(addr).map_err(|source| NetnsError::Bind { addr, source })?;
    // SAFETY: listen on the socket we just bound; raising the backlog of a listening socket
    // is allowed.
    unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
    Ok(NetnsSockets {
        listener,
        diag: super::procfs::SockDiag::socket().ok(),
    })
}

/// Bring `lo` of the calling thread's network namespace up.
pub fn loopback_up() -> io::Result<()> {
    let s = dgram_socket()?;
    // SAFETY: ioctls on a socket we own, with a zeroed ifreq on our stack naming "lo".
    unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, b) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *b as libc::c_char;
        }
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn dgram_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked and owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Add `addr`/32, scope host, to `lo` of the calling thread's network namespace, with one
/// rtnetlink RTM_NEWADDR (the ioctl interface would first add the address with its classful
/// prefix, routing a whole /8 to `lo` for a moment). An address already there is fine.
pub fn add_loopback_address(addr: Ipv4Addr) -> io::Result<()> {
    // SAFETY: socket(2) with constant arguments; checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let lo = c"lo";
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(lo.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    // nlmsghdr (16) + ifaddrmsg (8) + IFA_LOCAL (8) + IFA_ADDRESS (8).
    let mut m = Vec::with_capacity(40);
    m.extend_from_slice(&40u32.to_ne_bytes());
    m.extend_from_slice(&libc::RTM_NEWADDR.to_ne_bytes());
    let flags = libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_EXCL;
    m.extend_from_slice(&(flags as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.push(libc::AF_INET as u8);
    m.push(32);
    m.push(0);
    m.push(libc::RT_SCOPE_HOST);
    m.extend_from_slice(&index.to_ne_bytes());
    for ty in [libc::IFA_LOCAL, libc::IFA_ADDRESS] {
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&addr.octets());
    }
    let code = netlink_call(sock.as_raw_fd(), &m)?;
    match code {
        0 => Ok(()),
        e if e == -libc::EEXIST => Ok(()),
        e => Err(io::Error::from_raw_os_error(-e)),
    }
}

/// Send one request on a netlink socket and return the errno field of its NLMSG_ERROR answer
/// (0 for the acknowledgement).
fn netlink_call(fd: RawFd, msg: &[u8]) -> io::Result<i32> {
    // SAFETY: sockaddr_nl zeroed (pid 0: the kernel) and sized correctly.
    let sent = unsafe {
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 512];
    // SAFETY: recv into our buffer, its length given.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n < 20 || u16::from_ne_bytes([buf[4], buf[5]]) != libc::NLMSG_ERROR as u16 {
        return Err(io::Error::other("unexpected rtnetlink answer"));
    }
    Ok(i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]))
}
