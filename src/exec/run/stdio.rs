//! `run`'s standard streams: the stdin feeder, the caller's terminal in raw mode, and whether
//! our stdout and stderr are one open file.

use std::os::fd::{AsFd, OwnedFd};

use crate::exec::RunError;

/// The child's stdin: the read end of a pipe that a thread of ours fills from our own stdin.
///
/// The child never gets our fd 0 itself. When that is a terminal, the open file description
/// and the tty behind it are shared with the caller: echo off, `TIOCSETD`, `TIOCEXCL` and
/// O_NONBLOCK would outlive the run, and writes to fd 0 would bypass `--max-output`. A pipe's
/// read end carries none of that (a write to it is EBADF). The thread's blocking write is the
/// backpressure; its end of the pipe closes at our EOF (or when the child is gone, EPIPE), so
/// EOF reaches the child. It is a plain thread, not a runtime task: a read of a terminal
/// cannot be cancelled, and process exit ends the thread wherever it blocks.
///
/// `run` makes the pipe with the command's other streams, before the sandbox, and starts the
/// thread only once the command runs ([`start_feeding`]), so that a run refused before it
/// takes nothing from our stdin; [`feed_stdin`] does both at once.
pub(crate) fn stdin_pipe() -> Result<(OwnedFd, OwnedFd), RunError> {
    crate::sys::pipe(0).map_err(|source| RunError::Io {
        what: "creating the stdin pipe",
        source,
    })
}

/// The feeder thread of [`stdin_pipe`]'s write end `w`, or of a pty master (`pty_master`, see
/// [`copy_stdin`]).
pub(crate) fn start_feeding(w: OwnedFd, pty_master: bool) -> Result<(), RunError> {
    std::thread::Builder::new()
        .name("stdin-feeder".into())
        .spawn(move || copy_stdin(w, pty_master))
        .map(drop)
        .map_err(|source| RunError::Io {
            what: "starting the stdin thread",
            source,
        })
}

/// [`stdin_pipe`] with its feeder already started: the read end.
pub(crate) fn feed_stdin() -> Result<OwnedFd, RunError> {
    let (r, w) = stdin_pipe()?;
    start_feeding(w, false)?;
    Ok(r)
}

/// Whether our stdin is /dev/null (`< /dev/null`, a caller's `Stdio::null()`, most batch
/// runs). Then the child gets a /dev/null of its own, read-only, instead of a pipe and a feeder
/// thread: it reads EOF either way, /dev/null holds no terminal state to share, and a write to
/// it fails (EBADF) as one to the pipe's read end does. That saves a thread and a pipe per run
/// (benches/corpus.rs).
pub(crate) fn stdin_is_dev_null() -> bool {
    // SAFETY: fstat and stat into zeroed stack structs; the path is a NUL-terminated literal.
    unsafe {
        let mut ours: libc::stat = std::mem::zeroed();
        let mut null: libc::stat = std::mem::zeroed();
        libc::fstat(0, &mut ours) == 0
            && ours.st_mode & libc::S_IFMT == libc::S_IFCHR
            && libc::stat(c"/dev/null".as_ptr(), &mut null) == 0
            && null.st_mode & libc::S_IFMT == libc::S_IFCHR
            && ours.st_rdev == null.st_rdev
    }
}

/// Block in poll(2) until `fd` is ready for `events`.
pub(super) fn wait_ready(fd: i32, events: libc::c_short) {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: poll on one pollfd on our stack.
    unsafe { libc::poll(&mut pfd, 1, -1) };
}

/// Copy our stdin to `w` until EOF on either side. `w` may be non-blocking (a pty master).
///
/// At our EOF the child must see one too. A pipe's end closes when `w` is dropped; a pty
/// master's does not (closing it would hang the terminal up), so on a pty ((`pty_master`)) the
/// line discipline's end-of-file character follows the data instead (`pty::write_eof`).
pub(crate) fn copy_stdin(w: OwnedFd, pty_master: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut last = None;
    loop {
        // SAFETY: read into our buffer from fd 0.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match crate::sys::errno() {
                libc::EINTR => continue,
                // The caller's stdin may be non-blocking (the flag belongs to its open file
                // description, which we must not change): wait for it instead.
                libc::EAGAIN => {
                    wait_ready(0, libc::POLLIN);
                    continue;
                }
                // EBADF (no stdin at all), EIO (a hung-up terminal): the end of our input.
                _ => break,
            }
        }
        if n == 0 {
            break;
        }
        let data = &buf[..n as usize];
        if crate::exec::pty::write_all_fd(w.as_fd(), data).is_err() {
            return; // EPIPE, EIO: nobody reads any more
        }
        last = data.last().copied();
    }
    if pty_master && let Err(e) = crate::exec::pty::write_eof(w.as_fd(), last) {
        tracing::debug!(error = %e, "could not pass the end of input to the pty");
    }
}

/// Our terminal's settings while `--tty` runs; put back on drop, so every way out of `run`
/// (the child's exit, a signal, the timeout, an error) restores them.
pub(super) struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    /// Raw mode on our stdin when it is a terminal, so that keys (^C, ^Z, ^\\) reach the
    /// child's pty instead of signalling us; `None` when stdin is no terminal.
    pub(super) fn enter() -> Result<Option<RawTerminal>, RunError> {
        // SAFETY: isatty/tcgetattr/tcsetattr on fd 0 with termios values on our stack.
        unsafe {
            if libc::isatty(0) != 1 {
                return Ok(None);
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return Err(RunError::Io {
                    what: "reading the terminal's settings",
                    source: std::io::Error::last_os_error(),
                });
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(0, libc::TCSANOW, &raw) != 0 {
                return Err(RunError::Io {
                    what: "putting the terminal in raw mode",
                    source: std::io::Error::last_os_error(),
                });
            }
            Ok(Some(RawTerminal { saved }))
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: tcsetattr on fd 0 with the settings read in `enter`.
        if unsafe { libc::tcsetattr(0, libc::TCSADRAIN, &self.saved) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "could not restore the terminal");
        }
    }
}

/// Our terminal's size, for the child's pty (80x24 when we have none).
pub(super) fn our_winsize() -> (u32, u32) {
    for fd in [0, 1, 2] {
        // SAFETY: TIOCGWINSZ fills a winsize on our stack.
        unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            if libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0 {
                return (u32::from(ws.ws_col), u32::from(ws.ws_row));
            }
        }
    }
    (80, 24)
}

/// Whether our stdout and stderr are the same open file description (`2>&1`): then the child
/// gets one pipe for both, so that their order is kept.
///
/// kcmp(KCMP_FILE) answers exactly. Where it is missing (no CONFIG_KCMP, or a seccomp policy
/// of our own container denies it) we fall back to fstat: the same device and inode is the
/// same pipe, terminal or socket, where writes of both interleave in one stream anyway; for a
/// regular file (`>f 2>f` opens it twice: two offsets, and merging would change what lands
/// in the file) we also require the same status flags and the same offset, which two
/// separately opened descriptions rarely share.
pub(super) fn same_open_file(a: i32, b: i32) -> bool {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: kcmp compares two of our own fds and returns a number; getpid cannot fail.
    let rc = unsafe {
        let pid = libc::getpid();
        libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b)
    };
    if rc == 0 {
        return true;
    }
    if rc > 0 {
        return false; // ordered: different descriptions
    }
    let st = |fd| {
        // SAFETY: fstat into a zeroed stack struct.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstat(fd, &mut st) == 0).then_some(st)
        }
    };
    let (Some(x), Some(y)) = (st(a), st(b)) else {
        return false;
    };
    if (x.st_dev, x.st_ino) != (y.st_dev, y.st_ino) {
        return false;
    }
    if x.st_mode & libc::S_IFMT != libc::S_IFREG {
        return true;
    }
    // SAFETY: fcntl and lseek on our own fds; neither changes anything.
    unsafe {
        libc::fcntl(a, libc::F_GETFL) == libc::fcntl(b, libc::F_GETFL)
            && libc::lseek(a, 0, libc::SEEK_CUR) == libc::lseek(b, 0, libc::SEEK_CUR)
    }
}

/// One pipe for the child's stdout and stderr together: (read end, two write ends).
pub(super) fn merged_pipe() -> Result<(OwnedFd, OwnedFd, OwnedFd), RunError> {
    let io = |source| RunError::Io {
        what: "creating the merged output pipe",
        source,
    };
    // O_CLOEXEC: the child must never hold the read end, or it would never see EPIPE when we
    // stop reading.
    let (r, w) = crate::sys::pipe(0).map_err(io)?;
    let w2 = w.try_clone().map_err(io)?;
    Ok((r, w, w2))
}

/// Whether our stdout and stderr are the same file (a terminal, say): then the child's
/// unterminated stdout line would also be glued onto the summary.
pub(super) fn stdout_is_stderr() -> bool {
    let st = |fd| {
        // SAFETY: fstat into a zeroed stack struct.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
        }
    };
    matches!((st(1), st(2)), (Some(a), Some(b)) if a == b)
}
