//! The client socket of an accepted connection, found in the sandbox's network namespace by
//! its 4-tuple: one `NETLINK_SOCK_DIAG` request ([`SockDiag::inode`]), or, on a kernel
//! without sock_diag, a scan of the namespace's `/proc/<pid>/net/tcp{,6}`
//! ([`tcp_table_inode`]).

use std::fs;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A `NETLINK_SOCK_DIAG` socket, and its one request: the inode of a TCP socket by 4-tuple.
pub struct SockDiag {
    fd: OwnedFd,
}

/// `inet_diag_sockid`.
#[repr(C)]
#[derive(Clone, Copy)]
struct SockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    iface: u32,
    cookie: [u32; 2],
}

/// `nlmsghdr` + `inet_diag_req_v2`.
#[repr(C)]
struct Request {
    len: u32,
    ty: u16,
    flags: u16,
    seq: u32,
    pid: u32,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// "No cookie": look the socket up by its tuple.
const NO_COOKIE: u32 = !0;

fn addr_bytes(ip: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => b[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => b.copy_from_slice(&v6.octets()),
    }
    b
}

impl SockDiag {
    /// A socket in the calling thread's network namespace.
    pub fn socket() -> io::Result<OwnedFd> {
        // SAFETY: socket(2) with constant arguments; checked and owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A kernel that never answers must not hold an identity worker for ever.
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a timeval of the right size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Ok(fd)
    }

    pub fn new(fd: OwnedFd) -> SockDiag {
        SockDiag { fd }
    }

    /// The inode of the TCP socket whose local end is `src` and remote end `dst`, or `None`
    /// when the namespace has no such socket.
    pub fn inode(&self, src: SocketAddr, dst: SocketAddr) -> io::Result<Option<u64>> {
        let family = if src.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let req = Request {
            len: std::mem::size_of::<Request>() as u32,
            ty: SOCK_DIAG_BY_FAMILY,
            flags: libc::NLM_F_REQUEST as u16,
            seq: 1,
            pid: 0,
            family: family as u8,
            protocol: libc::IPPROTO_TCP as u8,
            ext: 0,
            pad: 0,
            states: !0,
            id: SockId {
                sport: src.port().to_be_bytes(),
                dport: dst.port().to_be_bytes(),
                src: addr_bytes(src.ip()),
                dst: addr_bytes(dst.ip()),
                iface: 0,
                cookie: [NO_COOKIE, NO_COOKIE],
            },
        };
        // SAFETY: sendto of a repr(C) struct we own, with its size; recv into our buffer.
        let n = unsafe {
            if libc::send(
                self.fd.as_raw_fd(),
                (&req as *const Request).cast(),
                std::mem::size_of::<Request>(),
                0,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            let mut buf = [0u8; 256];
            let n = libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            (buf, n as usize)
        };
        let (buf, n) = n;
        if n < 16 {
            return Err(io::Error::other("short sock_diag answer"));
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        if ty == libc::NLMSG_ERROR as u16 {
            let e = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            return if e == -libc::ENOENT {
                Ok(None)
            } else {
                Err(io::Error::from_raw_os_error(-e))
            };
        }
        // nlmsghdr (16), then inet_diag_msg: family, state, timer, retrans (4), sockid (48),
        // expires, rqueue, wqueue, uid (16), inode.
        let at = 16 + 4 + 48 + 16;
        if ty != SOCK_DIAG_BY_FAMILY || n < at + 4 {
            return Err(io::Error::other("unexpected sock_diag answer"));
        }
        let inode = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        Ok(Some(u64::from(inode)))
    }
}

/// Scan `/proc/<pid>/net/tcp{,6}` (the namespace of `pid`) for the ESTABLISHED socket with
/// local end `src` and remote end `dst`.
pub fn tcp_table_inode(pid: u32, src: SocketAddr, dst: SocketAddr) -> io::Result<Option<u64>> {
    let file = if src.is_ipv4() { "tcp" } else { "tcp6" };
    let text = fs::read_to_string(format!("/proc/{pid}/net/{file}"))?;
    let want = (proc_addr(src), proc_addr(dst));
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 9 && f[3] == "01" && f[1] == want.0 && f[2] == want.1 {
            return Ok(f[9].parse().ok());
        }
    }
    Ok(None)
}

/// An address as `/proc/net/tcp` prints it: each 32-bit word of the address in host order,
/// then the port.
fn proc_addr(a: SocketAddr) -> String {
    let words: Vec<String> = match a.ip() {
        IpAddr::V4(v4) => vec![format!("{:08X}", u32::from_ne_bytes(v4.octets()))],
        IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    };
    format!("{}:{:04X}", words.concat(), a.port())
}
