//! Binary identity from the kernel: which process of the sandbox holds the client end of a
//! proxied connection, what it runs, and who its ancestors are.
//!
//! 1. The socket: the client end has the accepted connection's ends swapped. A
//!    `NETLINK_SOCK_DIAG` socket made inside the sandbox's namespace asks the kernel for
//!    exactly that 4-tuple ([`SockDiag::inode`]): one lookup, however many sockets the sandbox
//!    holds. Without sock_diag, the namespace's `/proc/<pid>/net/tcp{,6}` is scanned instead.
//! 2. Its owners: every process in the sandbox's network namespace whose fd table holds
//!    `socket:[inode]`. One scan indexes every socket of every such process, and a lookup
//!    trusts only an index built after its connection was accepted (a socket that existed
//!    before the scan is in it; an older index could name a process that has since passed the
//!    descriptor on), so a burst of connections costs one scan, not one each.
//! 3. For each owner: `/proc/<pid>/exe` (the kernel's path, in the sandbox's view; argv is
//!    never used), the ancestors up `PPid` while they are in the sandbox and are not the
//!    supervisor's own binary (the exec's init), at most 64; the absolute paths among their
//!    argv, for logs; the exec (PID namespace). All owners must agree.
//! 4. Trust on first use: the SHA-256 of each executable's live image is pinned per path the
//!    first time it is seen; a different image behind the same path later is refused.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::identity::{Caller, ExecKey, Identify, IdentityError, ns_inode};

/// Ancestors followed at most (OpenShell's bound).
const MAX_DEPTH: usize = 64;
/// The part of a cmdline read.
const MAX_CMDLINE: u64 = 64 * 1024;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> IdentityError {
    let what = what.into();
    move |source| IdentityError::Io { what, source }
}

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

/// socket inode -> the PIDs holding it, for the processes in one network namespace.
struct OwnerIndex {
    built: Option<Instant>,
    owners: HashMap<u64, Vec<u32>>,
    /// A process of the namespace, for the `/proc/<pid>/net/tcp` fallback.
    any_member: Option<u32>,
}

/// A pinned executable image.
struct Pin {
    fingerprint: (u64, i64, i64, u64, u64),
    sha256: String,
}

/// A caller worked out before: valid while every process of its chain is the same process
/// (start time), has the same parent and runs the same executable.
struct Known {
    /// (pid, start time, parent, executable), the caller first.
    chain: Vec<(u32, u64, u32, String)>,
    caller: Caller,
}

/// Callers remembered at most; the table is cleared when full.
const KNOWN_MAX: usize = 4096;

/// The real [`Identify`]: processes of one sandbox network namespace, read from `/proc`.
pub struct ProcIdentity {
    netns: u64,
    diag: Option<Mutex<SockDiag>>,
    /// The supervisor's own executable (device, inode): a process running it is the exec's
    /// init or the supervisor, where the ancestor chain stops.
    own_exe: (u64, u64),
    index: Mutex<OwnerIndex>,
    pins: Mutex<HashMap<String, Pin>>,
    known: Mutex<HashMap<u32, Known>>,
}

impl ProcIdentity {
    /// `netns` is the sandbox's network namespace; `diag` the sock_diag socket made in it
    /// ([`super::netns::NetnsSockets::diag`]).
    pub fn new(netns: BorrowedFd<'_>, diag: Option<OwnedFd>) -> io::Result<ProcIdentity> {
        let ino = fs::File::from(netns.try_clone_to_owned()?)
            .metadata()?
            .ino();
        let me = fs::metadata("/proc/self/exe")?;
        Ok(ProcIdentity {
            netns: ino,
            diag: diag.map(|d| Mutex::new(SockDiag::new(d))),
            own_exe: (me.dev(), me.ino()),
            index: Mutex::new(OwnerIndex {
                built: None,
                owners: HashMap::new(),
                any_member: None,
            }),
            pins: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
        })
    }

    fn in_netns(&self, pid: u32) -> bool {
        ns_inode(pid, "net").is_ok_and(|i| i == self.netns)
    }

    /// Rebuild the owner index from every process of the namespace.
    fn scan(&self, idx: &mut OwnerIndex) {
        let started = Instant::now();
        idx.owners.clear();
        idx.any_member = None;
        let Ok(dir) = fs::read_dir("/proc") else {
            return;
        };
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if !self.in_netns(pid) {
                continue;
            }
            idx.any_member.get_or_insert(pid);
            scan_fds(pid, &mut idx.owners);
        }
        idx.built = Some(started);
    }

    fn inode(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: Instant,
    ) -> Result<u64, IdentityError> {
        // The client socket: local end = our peer, remote end = our local address.
        let found = match &self.diag {
            Some(d) => d
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .inode(peer, local)
                .map_err(io_err("sock_diag lookup"))?,
            None => {
                let mut idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
                if idx.any_member.is_none() || idx.built.is_none_or(|b| b < accepted) {
                    self.scan(&mut idx);
                }
                match idx.any_member {
                    Some(pid) => tcp_table_inode(pid, peer, local)
                        .map_err(io_err(format!("reading /proc/{pid}/net/tcp")))?,
                    None => None,
                }
            }
        };
        found.ok_or(IdentityError::NoSocket { peer, local })
    }

    fn owners(&self, inode: u64, accepted: Instant) -> Vec<u32> {
        let mut idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if idx.built.is_none_or(|b| b < accepted) {
            self.scan(&mut idx);
        }
        let mut v = idx.owners.get(&inode).cloned().unwrap_or_default();
        v.sort_unstable();
        v
    }

    fn exe(&self, pid: u32) -> Result<String, IdentityError> {
        let raw = fs::read_link(format!("/proc/{pid}/exe"))
            .map_err(io_err(format!("readlink /proc/{pid}/exe")))?;
        let s = raw.to_string_lossy().into_owned();
        // The kernel appends " (deleted)" to an unlinked image; a file really named so stays.
        if let Some(stripped) = s.strip_suffix(" (deleted)") {
            let in_root =
                PathBuf::from(format!("/proc/{pid}/root")).join(s.trim_start_matches('/'));
            if fs::symlink_metadata(&in_root).is_err() {
                return Ok(stripped.to_string());
            }
        }
        Ok(s)
    }

    fn is_own_binary(&self, pid: u32) -> bool {
        fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|m| (m.dev(), m.ino()) == self.own_exe)
    }

    /// Pin (or check) the image of `pid`'s executable, known as `path`.
    fn verify(&self, pid: u32, path: &str) -> Result<(), IdentityError> {
        let mut f = fs::File::open(format!("/proc/{pid}/exe"))
            .map_err(io_err(format!("opening /proc/{pid}/exe")))?;
        let m = f.metadata().map_err(io_err("fstat of the executable"))?;
        let fp = (m.len(), m.mtime(), m.ctime(), m.dev(), m.ino());
        if let Some(pin) = self
            .pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            && pin.fingerprint == fp
        {
            return Ok(());
        }
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = f
                .read(&mut buf)
                .map_err(io_err(format!("hashing {path}")))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let sha256 = hex::encode(h.finalize());
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        match pins.get_mut(path) {
            Some(pin) if pin.sha256 != sha256 => Err(IdentityError::Integrity {
                path: path.to_string(),
                cached: pin.sha256.clone(),
                current: sha256,
            }),
            Some(pin) => {
                pin.fingerprint = fp;
                Ok(())
            }
            None => {
                pins.insert(
                    path.to_string(),
                    Pin {
                        fingerprint: fp,
                        sha256,
                    },
                );
                Ok(())
            }
        }
    }

    /// A remembered caller, re-checked: a few reads per process of its chain instead of the
    /// whole walk (cmdlines, namespaces), which a burst of connections from one process
    /// would otherwise repeat for each.
    fn known(&self, pid: u32) -> Option<Caller> {
        let (chain, caller) = {
            let k = self.known.lock().unwrap_or_else(|p| p.into_inner());
            let e = k.get(&pid)?;
            (e.chain.clone(), e.caller.clone())
        };
        for (p, start, parent, exe) in &chain {
            if stat(*p)? != (*parent, *start) || self.exe(*p).ok()? != *exe {
                return None;
            }
            // A changed image falls back to the whole walk, which reports it.
            self.verify(*p, exe).ok()?;
        }
        Some(caller)
    }

    fn caller(&self, pid: u32) -> Result<Caller, IdentityError> {
        if let Some(c) = self.known(pid) {
            return Ok(c);
        }
        let first = stat(pid);
        let exe = self.exe(pid)?;
        self.verify(pid, &exe)?;
        let mut ancestors = Vec::new();
        let mut chain = vec![pid];
        let mut cur = pid;
        while ancestors.len() < MAX_DEPTH {
            let Some(ppid) = ppid(cur) else { break };
            if ppid <= 1 || !self.in_netns(ppid) || self.is_own_binary(ppid) {
                break;
            }
            let Ok(a) = self.exe(ppid) else { break };
            self.verify(ppid, &a).map_err(|e| match e {
                IdentityError::Integrity { .. } => IdentityError::Io {
                    what: format!("ancestor integrity check failed for {a}"),
                    source: io::Error::other(e.to_string()),
                },
                e => e,
            })?;
            ancestors.push(a);
            chain.push(ppid);
            cur = ppid;
        }
        let mut cmdline_paths = Vec::new();
        for p in &chain {
            for arg in cmdline(*p) {
                if arg.starts_with('/')
                    && arg != exe
                    && !ancestors.contains(&arg)
                    && !cmdline_paths.contains(&arg)
                {
                    cmdline_paths.push(arg);
                }
            }
        }
        let exec = ExecKey(ns_inode(pid, "pid").map_err(io_err(format!("/proc/{pid}/ns/pid")))?);
        let caller = Caller {
            pid,
            exe,
            ancestors,
            cmdline_paths,
            exec,
        };
        // Remembered only when every process of the chain could be pinned by its start time.
        let exes = std::iter::once(&caller.exe).chain(&caller.ancestors);
        let stats: Option<Vec<(u32, u64)>> = std::iter::once(first)
            .chain(chain[1..].iter().map(|p| stat(*p)))
            .collect();
        if let Some(stats) = stats {
            let chain = chain
                .iter()
                .zip(stats)
                .zip(exes)
                .map(|((p, (parent, start)), exe)| (*p, start, parent, exe.clone()))
                .collect();
            let mut k = self.known.lock().unwrap_or_else(|p| p.into_inner());
            if k.len() >= KNOWN_MAX {
                k.clear();
            }
            k.insert(
                pid,
                Known {
                    chain,
                    caller: caller.clone(),
                },
            );
        }
        Ok(caller)
    }
}

/// Add every socket in `pid`'s fd table to `owners`. readlinkat on the directory's descriptor
/// with one buffer: this runs for every descriptor of the sandbox on each rescan.
fn scan_fds(pid: u32, owners: &mut HashMap<u64, Vec<u32>>) {
    let path = format!("/proc/{pid}/fd");
    let Ok(dir) = fs::read_dir(&path) else { return };
    let Ok(c) = std::ffi::CString::new(path) else {
        return;
    };
    // SAFETY: open(2) of a NUL-terminated path; the result is checked and owned.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let dirfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut buf = [0u8; 64];
    for e in dir.flatten() {
        let Ok(name) = std::ffi::CString::new(e.file_name().into_encoded_bytes()) else {
            continue;
        };
        // SAFETY: readlinkat into our buffer, its length given; the result is checked.
        let n = unsafe {
            libc::readlinkat(
                dirfd.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n <= 0 {
            continue;
        }
        let l = &buf[..n as usize];
        if let Some(ino) = l
            .strip_prefix(b"socket:[")
            .and_then(|r| r.strip_suffix(b"]"))
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u64>().ok())
        {
            let v = owners.entry(ino).or_default();
            if !v.contains(&pid) {
                v.push(pid);
            }
        }
    }
}

/// `(ppid, starttime)` from `/proc/<pid>/stat`: the start time tells a process from a later
/// one with the same pid.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields start after the last ')'.
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

fn ppid(pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn cmdline(pid: u32) -> Vec<String> {
    let mut b = Vec::new();
    if let Ok(f) = fs::File::open(format!("/proc/{pid}/cmdline")) {
        let _ = f.take(MAX_CMDLINE).read_to_end(&mut b);
    }
    b.split(|c| *c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

impl Identify for ProcIdentity {
    fn identify(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        accepted: Instant,
    ) -> Result<Caller, IdentityError> {
        let inode = self.inode(peer, local, accepted)?;
        let pids = self.owners(inode, accepted);
        if pids.is_empty() {
            return Err(IdentityError::NoOwner { inode });
        }
        let mut first: Option<Caller> = None;
        for pid in &pids {
            // A process that exited since the scan no longer holds the socket.
            let c = match self.caller(*pid) {
                Ok(c) => c,
                Err(IdentityError::Io { source, .. })
                    if source.kind() == io::ErrorKind::NotFound && pids.len() > 1 =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            match &first {
                None => first = Some(c),
                Some(f) => {
                    if (&f.exe, &f.ancestors, &f.cmdline_paths)
                        != (&c.exe, &c.ancestors, &c.cmdline_paths)
                    {
                        return Err(IdentityError::Ambiguous { inode, pids });
                    }
                }
            }
        }
        first.ok_or(IdentityError::NoOwner { inode })
    }
}

/// The paths `path` leads to through symlinks inside `root` (the sandbox's root as the
/// supervisor sees it, e.g. `/proc/<pid>/root`), for
/// [`crate::policy::network::NetworkRules::expand_binary_links`]: each whole path after a link
/// was followed, the last one with no link left in it. Links are read one component at a time
/// and never followed by the kernel, so an absolute target stays inside `root`. Nothing is
/// returned for a path with no link on it, or one that does not exist.
pub fn links_in_root(root: &Path, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .rev()
        .map(String::from)
        .collect();
    let mut done: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = pending.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        done.push(c);
        let at = root.join(done.join("/"));
        let Ok(m) = fs::symlink_metadata(&at) else {
            return Vec::new();
        };
        if !m.file_type().is_symlink() {
            continue;
        }
        hops += 1;
        let Ok(target) = fs::read_link(&at) else {
            return Vec::new();
        };
        if hops > 40 {
            return Vec::new();
        }
        done.pop();
        let t = target.to_string_lossy().into_owned();
        if t.starts_with('/') {
            done.clear();
        }
        for part in t.split('/').filter(|p| !p.is_empty()).rev() {
            pending.push(part.to_string());
        }
        let mut whole: Vec<String> = done.clone();
        whole.extend(pending.iter().rev().cloned());
        out.push(format!("/{}", whole.join("/")));
    }
    if !out.is_empty() {
        let last = format!("/{}", done.join("/"));
        if out.last() != Some(&last) {
            out.push(last);
        }
    }
    // A spelling with dot segments is no executable path the kernel reports.
    out.retain(|p| !p.split('/').any(|c| c == ".." || c == "."));
    out.dedup();
    out
}
