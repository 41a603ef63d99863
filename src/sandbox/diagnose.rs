//! Why a program cannot start, found out inside the view by the command's own process.
//!
//! When execve fails, the command child already is what the program would have been: in the
//! view's root, as the sandbox identity, under Landlock and seccomp. So it looks there, and what
//! it reports is only what the sandbox could learn for itself: nothing about the host outside
//! the view (the supervisor, as root on the host, would see whether a path outside the grants
//! exists). `check` runs the same examination in a child that joins the view the same way
//! and does not exec (`probe` in init.rs).
//!
//! What it examines it never opens, except a regular file to read its first bytes:
//! - each path is walked one component at a time from the view's root (or the working
//!   directory), `openat(O_PATH|O_NOFOLLOW)`, links followed by `readlinkat` on their own
//!   descriptor, so that the walk can say which component is missing ("/lib64 does not exist")
//!   and where the links led;
//! - the type and owner come from `fstat` of that descriptor, the execute right from
//!   `faccessat2(AT_EMPTY_PATH)` on it;
//! - an ELF header or `#!` line is read only from a regular file, reopened through
//!   `/proc/self/fd/N` of that same descriptor (which can only reach that inode), `O_RDONLY |
//!   O_NONBLOCK | O_NOCTTY`, and fstat'ed again. A FIFO or a device named as the program, or
//!   linked from it, is never opened: it can neither block the examination nor act.
//!
//! Every step is a raw syscall on fixed buffers (the command child shares the init's memory
//! until it would have exec'd), and the work is bounded: at most [`MAX_LINKS`] links per path
//! and [`MAX_LEVELS`] interpreters. The supervisor waits a bounded time for the result and kills
//! the exec when it does not come (a hung network filesystem).
//!
//! The result travels as one record of at most `PIPE_BUF` bytes on the exec's error pipe, after
//! the [`super::ChildError`] of the failed execve.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::path::PathBuf;

use crate::sys::proc_fd_path;

mod format;
pub(crate) use format::{Elf, shebang};

/// The most a record takes: one atomic pipe write (PIPE_BUF).
pub const RECORD_MAX: usize = 4096;
/// The longest path a record carries; longer ones are cut and marked.
const SHOWN: usize = 1000;
/// A working path: PATH_MAX.
const CAP: usize = 4096;
/// As many links as the kernel follows in one lookup (MAXSYMLINKS).
const MAX_LINKS: u32 = 40;
/// Interpreters followed from the program: the kernel allows a script's interpreter to be a
/// script itself four levels deep (BINPRM's recursion limit), then one ELF with its loader.
const MAX_LEVELS: u8 = 6;
/// The first bytes the kernel reads to pick a format (BINPRM_BUF_SIZE).
const HEAD: usize = 256;
const MAGIC: u8 = 0xd1;

/// What the examination found.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// The program and every interpreter it needs are in the view, regular and executable.
    Startable = 1,
    /// No candidate of the program exists in the view.
    NotFound,
    /// The subject (the program or an interpreter) is not a regular file; `mode` says what.
    NotRegular,
    /// The sandbox identity may not search the directory `at` on the way to the subject.
    NoSearch,
    /// The subject's mode does not let the sandbox identity execute it.
    NoExecute,
    /// The interpreter `subject`, named by `holder`, is not in the view: the walk stopped at
    /// `at` (the first missing component) on its way to `full`.
    InterpreterMissing,
    /// Everything is in place as far as the view shows; `errno` says the rest (Landlock, a
    /// noexec mount, an unknown format, a path walk that failed otherwise).
    Unexplained,
}

impl Finding {
    fn from_u8(b: u8) -> Option<Finding> {
        use Finding::*;
        [
            Startable,
            NotFound,
            NotRegular,
            NoSearch,
            NoExecute,
            InterpreterMissing,
            Unexplained,
        ]
        .into_iter()
        .find(|f| *f as u8 == b)
    }
}

/// How a file names its interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interp {
    /// ELF `PT_INTERP`: the dynamic loader.
    Elf,
    /// The `#!` line of a script.
    Script,
}

/// The examination, as the supervisor reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub finding: Finding,
    /// Which candidate of the program was examined (an index into the plan's candidates).
    pub candidate: Option<usize>,
    /// The file the finding is about: the program, or the interpreter it needs.
    pub subject: PathBuf,
    /// The file that names `subject` as its interpreter (absent for the program itself).
    pub holder: Option<PathBuf>,
    /// How `holder` names `subject`.
    pub interp: Option<Interp>,
    /// NotFound / InterpreterMissing: the first missing component; NoSearch: the directory.
    pub at: PathBuf,
    /// NotFound / InterpreterMissing: the whole path the links led to.
    pub full: PathBuf,
    pub mode: u32,
    pub owner: u32,
    pub errno: i32,
    /// The subject lies on a noexec mount.
    pub noexec: bool,
    /// A path was too long to carry whole.
    pub truncated: bool,
    /// The subject's first bytes could not be read (no /proc in the view, no read right), so
    /// its interpreter is unknown.
    pub unreadable: bool,
}

impl Diagnosis {
    /// Decode a record (see [`Record`]); `None` for anything malformed.
    pub fn decode(b: &[u8]) -> Option<Diagnosis> {
        if b.len() < 20 || b[0] != MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut off = 20;
        let mut strings = [
            PathBuf::new(),
            PathBuf::new(),
            PathBuf::new(),
            PathBuf::new(),
        ];
        for s in &mut strings {
            let len = usize::from(u16::from_ne_bytes([*b.get(off)?, *b.get(off + 1)?]));
            // Paths come from files the sandbox wrote (a `#!` line): control characters are
            // shown as `?`, so that a message cannot drive the caller's terminal.
            let bytes: Vec<u8> = b
                .get(off + 2..off + 2 + len)?
                .iter()
                .map(|&c| if c < 0x20 || c == 0x7f { b'?' } else { c })
                .collect();
            *s = PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes),
            );
            off += 2 + len;
        }
        let [subject, holder, at, full] = strings;
        Some(Diagnosis {
            finding: Finding::from_u8(b[1])?,
            candidate: (b[2] != NONE).then_some(usize::from(b[2])),
            holder: (!holder.as_os_str().is_empty()).then_some(holder),
            interp: match b[4] {
                1 => Some(Interp::Elf),
                2 => Some(Interp::Script),
                _ => None,
            },
            subject,
            at,
            full,
            errno: u32_at(8) as i32,
            mode: u32_at(12),
            owner: u32_at(16),
            noexec: b[5] & 1 != 0,
            truncated: b[5] & 2 != 0,
            unreadable: b[5] & 4 != 0,
        })
    }
}

/// No candidate (in the record's candidate byte).
const NONE: u8 = 255;
/// Most candidates a plan may hold, so that each has an index below [`NONE`].
pub const MAX_CANDIDATES: usize = NONE as usize;

// ---- in the child: raw syscalls on fixed buffers only ----

/// A path in a fixed buffer, always NUL-terminated after `n` bytes.
struct Buf {
    b: [u8; CAP],
    n: usize,
}

impl Buf {
    const fn new() -> Buf {
        Buf { b: [0; CAP], n: 0 }
    }

    fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }

    /// Replace the contents; false (and unchanged) when too long.
    fn set(&mut self, s: &[u8]) -> bool {
        if s.len() >= CAP {
            return false;
        }
        self.b[..s.len()].copy_from_slice(s);
        self.n = s.len();
        self.b[self.n] = 0;
        true
    }

    fn append(&mut self, s: &[u8]) -> bool {
        if self.n + s.len() >= CAP {
            return false;
        }
        self.b[self.n..self.n + s.len()].copy_from_slice(s);
        self.n += s.len();
        self.b[self.n] = 0;
        true
    }

    /// Append `/name` (a path here never ends in `/`; the root is empty).
    fn push(&mut self, name: &[u8]) -> bool {
        self.append(b"/") && self.append(name)
    }

    /// Drop the last component (the root stays the root).
    fn pop(&mut self) {
        let cut = self.bytes().iter().rposition(|&c| c == b'/').unwrap_or(0);
        self.n = cut;
        self.b[cut] = 0;
    }
}

/// A descriptor closed when dropped. Async-signal-safe.
struct Fd(RawFd);

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: closing a descriptor this guard owns.
            unsafe { libc::close(self.0) };
        }
    }
}

fn errno() -> i32 {
    crate::sys::errno()
}

fn fstat(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: fstat into a zeroed struct on our stack.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the descriptor is the caller's.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

fn is(st: &libc::stat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// Where a walk ended.
enum Walked {
    /// The final inode, by its O_PATH descriptor.
    Found(Fd, libc::stat),
    /// `at` does not exist (or a component before it is not a directory).
    Missing,
    /// The directory `at` may not be searched; its fstat.
    NoSearch(libc::stat),
    /// Any other failure: too many links, a path too long, an errno of the lookup.
    Failed(i32),
}

/// Walk `path` inside the root `root` (an absolute path, or one relative to the working
/// directory `cwd` whose path is `cwd_path`), never following a link by name. On return `at`
/// holds the path walked so far (for Missing: up to and including the missing component) and
/// `full` that path with whatever was left to walk.
fn walk(root: RawFd, cwd: (RawFd, &[u8]), path: &[u8], at: &mut Buf, full: &mut Buf) -> Walked {
    let mut todo = Buf::new();
    let mut next = Buf::new();
    if !todo.set(path) {
        return Walked::Failed(libc::ENAMETOOLONG);
    }
    let start = |rel: bool, at: &mut Buf| {
        let (fd, p) = if rel { cwd } else { (root, &b""[..]) };
        at.set(p);
        // SAFETY: duplicating a descriptor the caller holds.
        Fd(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })
    };
    let mut cur = start(!path.starts_with(b"/"), at);
    let mut pos = 0;
    let mut links = 0;
    loop {
        let Some(cur_st) = fstat(cur.0) else {
            return Walked::Failed(errno());
        };
        // The next component of `todo`.
        let t = todo.bytes();
        while pos < t.len() && t[pos] == b'/' {
            pos += 1;
        }
        if pos == t.len() {
            full.set(at.bytes());
            return Walked::Found(cur, cur_st);
        }
        let end = t[pos..]
            .iter()
            .position(|&c| c == b'/')
            .map_or(t.len(), |e| pos + e);
        let mut name = [0u8; 256];
        let len = end - pos;
        if len >= name.len() {
            return Walked::Failed(libc::ENAMETOOLONG);
        }
        name[..len].copy_from_slice(&t[pos..end]);
        let rest_at = end;
        pos = end;
        let comp = &name[..len];
        if comp == b"." {
            continue;
        }
        if comp == b".." {
            if at.n > 0 {
                // SAFETY: a lookup of ".." relative to a descriptor we own.
                let up = Fd(unsafe {
                    libc::openat(
                        cur.0,
                        c"..".as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                });
                if up.0 < 0 {
                    return Walked::Failed(errno());
                }
                cur = up;
                at.pop();
            }
            continue;
        }
        if !is(&cur_st, libc::S_IFDIR) {
            full.set(at.bytes());
            return Walked::Missing;
        }
        // SAFETY: a NUL-terminated name relative to a descriptor we own.
        let fd = Fd(unsafe {
            libc::openat(
                cur.0,
                name.as_ptr().cast(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        });
        if fd.0 < 0 {
            let e = errno();
            return match e {
                libc::ENOENT | libc::ENOTDIR => {
                    at.push(comp);
                    full.set(at.bytes());
                    full.append(&todo.bytes()[rest_at..]);
                    Walked::Missing
                }
                libc::EACCES => {
                    full.set(at.bytes());
                    Walked::NoSearch(cur_st)
                }
                e => Walked::Failed(e),
            };
        }
        let Some(st) = fstat(fd.0) else {
            return Walked::Failed(errno());
        };
        if !is(&st, libc::S_IFLNK) {
            if !at.push(comp) {
                return Walked::Failed(libc::ENAMETOOLONG);
            }
            cur = fd;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Walked::Failed(libc::ELOOP);
        }
        let mut target = [0u8; CAP];
        // SAFETY: an empty name with an O_PATH|O_NOFOLLOW descriptor of the link reads the link
        // itself; the buffer is ours, one byte kept for the NUL.
        let n = unsafe {
            libc::readlinkat(
                fd.0,
                c"".as_ptr(),
                target.as_mut_ptr().cast(),
                target.len() - 1,
            )
        };
        if n <= 0 {
            return Walked::Failed(if n < 0 { errno() } else { libc::ENOENT });
        }
        let target = &target[..n as usize];
        // The link's target, then what was left after it (empty, or starting with `/`).
        if !(next.set(target) && next.append(&todo.bytes()[rest_at..])) {
            return Walked::Failed(libc::ENAMETOOLONG);
        }
        todo.set(next.bytes());
        pos = 0;
        // A relative target resolves from the link's directory, which `cur` still is.
        if target.starts_with(b"/") {
            cur = start(false, at);
        }
    }
}

/// What a file says about its interpreter.
enum Named {
    /// None: a static ELF, the loader itself, or a format the kernel decides about.
    Nothing,
    Interp(Interp),
    /// It could not be read (no /proc in the view, no read right): nothing is known.
    Unreadable,
}

/// The interpreter the regular file behind `fd` (an O_PATH descriptor, fstat'ed as `st`)
/// names, into `out`.
fn named_interp(fd: RawFd, st: &libc::stat, out: &mut Buf) -> Named {
    let mut p = [0u8; 32];
    proc_fd_path(&mut p, fd);
    // SAFETY: a NUL-terminated path; the magic link reaches only the inode behind `fd`.
    let file = Fd(unsafe {
        libc::open(
            p.as_ptr().cast(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    });
    if file.0 < 0 {
        return Named::Unreadable;
    }
    match fstat(file.0) {
        Some(s) if is(&s, libc::S_IFREG) && (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino) => {}
        _ => return Named::Unreadable,
    }
    let read = |off: u64, buf: &mut [u8]| -> usize {
        // SAFETY: reading into the caller's buffer from a descriptor we own.
        let n = unsafe { libc::pread(file.0, buf.as_mut_ptr().cast(), buf.len(), off as i64) };
        n.max(0) as usize
    };
    let mut head = [0u8; HEAD];
    let n = read(0, &mut head);
    let head = &head[..n];
    if let Some(i) = shebang(head) {
        return if out.set(i) {
            Named::Interp(Interp::Script)
        } else {
            Named::Unreadable
        };
    }
    let Some(elf) = Elf::parse(head) else {
        return Named::Nothing;
    };
    let mut phdrs = [0u8; CAP];
    let want = (elf.phnum * elf.phentsize).min(phdrs.len());
    let got = read(elf.phoff, &mut phdrs[..want]);
    let Some((off, size)) = elf.interp(&phdrs[..got]) else {
        return Named::Nothing;
    };
    let mut name = [0u8; CAP];
    let size = (size as usize).min(CAP - 1);
    let got = read(off, &mut name[..size]);
    let name = &name[..got];
    let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
    if name.is_empty() || !out.set(name) {
        return Named::Unreadable;
    }
    Named::Interp(Interp::Elf)
}

/// One record, built in place.
pub(crate) struct Record {
    b: [u8; RECORD_MAX],
    n: usize,
}

impl Record {
    fn new(finding: Finding, candidate: u8) -> Record {
        let mut r = Record {
            b: [0; RECORD_MAX],
            n: 20,
        };
        r.b[0] = MAGIC;
        r.b[1] = finding as u8;
        r.b[2] = candidate;
        r
    }

    fn finding(&mut self, f: Finding) {
        self.b[1] = f as u8;
    }

    fn interp(&mut self, i: Option<Interp>) {
        self.b[4] = match i {
            None => 0,
            Some(Interp::Elf) => 1,
            Some(Interp::Script) => 2,
        };
    }

    fn flag(&mut self, bit: u8) {
        self.b[5] |= bit;
    }

    fn numbers(&mut self, errno: i32, mode: u32, owner: u32) {
        self.b[8..12].copy_from_slice(&errno.to_ne_bytes());
        self.b[12..16].copy_from_slice(&mode.to_ne_bytes());
        self.b[16..20].copy_from_slice(&owner.to_ne_bytes());
    }

    /// The four paths, in order: subject, holder, at, full.
    fn paths(&mut self, paths: [&[u8]; 4]) {
        self.n = 20;
        for p in paths {
            let p = if p.len() > SHOWN {
                self.flag(2);
                &p[..SHOWN]
            } else {
                p
            };
            self.b[self.n..self.n + 2].copy_from_slice(&(p.len() as u16).to_ne_bytes());
            self.b[self.n + 2..self.n + 2 + p.len()].copy_from_slice(p);
            self.n += 2 + p.len();
        }
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }

    /// One write of the whole record (below PIPE_BUF: atomic). Async-signal-safe.
    fn send(&self, fd: RawFd) {
        // SAFETY: writing our own buffer.
        unsafe { libc::write(fd, self.b.as_ptr().cast(), self.n) };
    }
}

/// "/" for the root's empty path.
fn shown(b: &Buf) -> &[u8] {
    if b.n == 0 { b"/" } else { b.bytes() }
}

/// Examine the program at `path` and the interpreters it needs, into `rec`.
fn examine(root: RawFd, cwd: (RawFd, &[u8]), path: &[u8], rec: &mut Record) {
    let mut subject = Buf::new();
    let mut holder = Buf::new();
    let mut named = Buf::new();
    let (mut at, mut full) = (Buf::new(), Buf::new());
    subject.set(path);
    let mut interp = None;
    for _ in 0..MAX_LEVELS {
        let walked = walk(root, cwd, subject.bytes(), &mut at, &mut full);
        rec.interp(interp);
        let (finding, st) = match walked {
            Walked::Missing if interp.is_none() => (Finding::NotFound, None),
            Walked::Missing => (Finding::InterpreterMissing, None),
            Walked::NoSearch(st) => (Finding::NoSearch, Some(st)),
            Walked::Failed(e) => {
                rec.numbers(e, 0, 0);
                (Finding::Unexplained, None)
            }
            Walked::Found(fd, st) => {
                let (finding, next) = found(&fd, &st, &mut named, rec);
                match next {
                    Some(kind) => {
                        holder.set(subject.bytes());
                        subject.set(named.bytes());
                        interp = Some(kind);
                        continue;
                    }
                    None => (finding, Some(st)),
                }
            }
        };
        rec.finding(finding);
        if let Some(st) = st
            && finding != Finding::Unexplained
        {
            rec.numbers(0, st.st_mode, st.st_uid);
        }
        rec.paths([subject.bytes(), holder.bytes(), shown(&at), shown(&full)]);
        return;
    }
    rec.finding(Finding::Unexplained);
    rec.numbers(libc::ELOOP, 0, 0);
    rec.paths([subject.bytes(), holder.bytes(), b"", b""]);
}

/// A regular-or-not file the walk found: the finding, or the interpreter to look at next.
fn found(fd: &Fd, st: &libc::stat, named: &mut Buf, rec: &mut Record) -> (Finding, Option<Interp>) {
    if !is(st, libc::S_IFREG) {
        return (Finding::NotRegular, None);
    }
    // First, as access(X_OK) answers EACCES on a noexec mount whatever the mode.
    // SAFETY: fstatvfs into a zeroed struct on our stack (one fstatfs: the kernel reports the
    // mount flags itself); O_PATH descriptors allow it.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatvfs(fd.0, &mut vfs) } == 0 && vfs.f_flag & libc::ST_NOEXEC != 0 {
        rec.flag(1);
        return (Finding::Unexplained, None);
    }
    // SAFETY: faccessat2 on our descriptor with an empty path; as the sandbox identity, with
    // its real ids (AT_EACCESS: the effective ones, equal here).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.0,
            c"".as_ptr(),
            libc::X_OK,
            libc::AT_EMPTY_PATH | libc::AT_EACCESS,
        )
    };
    if rc != 0 && errno() == libc::EACCES {
        return (Finding::NoExecute, None);
    }
    match named_interp(fd.0, st, named) {
        Named::Interp(kind) => (Finding::Startable, Some(kind)),
        Named::Nothing => (Finding::Startable, None),
        Named::Unreadable => {
            rec.flag(4);
            (Finding::Unexplained, None)
        }
    }
}

/// Whether `path` exists in the view at all (anything the walk finds, of any type).
fn exists(root: RawFd, cwd: (RawFd, &[u8]), path: &[u8]) -> bool {
    let (mut at, mut full) = (Buf::new(), Buf::new());
    !matches!(
        walk(root, cwd, path, &mut at, &mut full),
        Walked::Missing | Walked::Failed(libc::ENOENT)
    )
}

/// The view's root and working directory, as descriptors of this process.
fn here() -> (Fd, Fd) {
    let open = |p: &std::ffi::CStr| {
        // SAFETY: a NUL-terminated path.
        Fd(unsafe {
            libc::open(
                p.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })
    };
    (open(c"/"), open(c"."))
}

/// Examine the program whose candidates are `candidates` and send the record on `fd`.
/// `decided`: the candidate and errno that decided the failed exec (`None`: every candidate
/// was ENOENT; the first one that exists is examined, as the kernel's ENOENT then came from
/// its interpreter). Without a failed exec (`check`), `decided` is `None` too.
///
/// # Safety
/// In the command child (or check's probe child) only, after its layers.
pub(crate) unsafe fn diagnose(
    candidates: &[CString],
    decided: Option<usize>,
    errno: i32,
    cwd: &[u8],
    fd: RawFd,
) {
    let (root, dot) = here();
    let cwd = (dot.0, cwd);
    let pick = decided.or_else(|| {
        candidates
            .iter()
            .position(|c| exists(root.0, cwd, c.as_bytes()))
    });
    let mut rec = Record::new(Finding::NotFound, pick.map_or(NONE, |i| i as u8));
    match pick {
        Some(i) => examine(root.0, cwd, candidates[i].as_bytes(), &mut rec),
        None => {
            // Only a path names its missing component; a name searched in PATH was simply
            // not found.
            let (mut at, mut full) = (Buf::new(), Buf::new());
            let only = (candidates.len() == 1).then(|| candidates[0].as_bytes());
            if let Some(p) = only {
                walk(root.0, cwd, p, &mut at, &mut full);
            }
            rec.paths([only.unwrap_or(b""), b"", shown(&at), shown(&full)]);
        }
    }
    // The exec's own errno, where the examination found nothing more specific to say.
    if rec.b[1] == Finding::Unexplained as u8 && rec.b[8..12] == [0; 4]
        || rec.b[1] == Finding::Startable as u8
    {
        rec.b[8..12].copy_from_slice(&errno.to_ne_bytes());
    }
    rec.send(fd);
}

/// The interpreter the file behind `fd` (an O_PATH descriptor) names, read as the examination
/// reads it: only from a regular file, reopened through /proc/self/fd. For `check`, which asks
/// it of the host's /bin/sh to learn the system's dynamic loader.
pub fn interpreter_of(fd: std::os::fd::BorrowedFd<'_>) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let st = fstat(fd.as_raw_fd())?;
    if !is(&st, libc::S_IFREG) {
        return None;
    }
    let mut out = Buf::new();
    match named_interp(fd.as_raw_fd(), &st, &mut out) {
        Named::Interp(_) => Some(PathBuf::from(std::ffi::OsStr::from_bytes(out.bytes()))),
        _ => None,
    }
}

#[cfg(test)]
#[path = "diagnose_tests.rs"]
mod tests;
