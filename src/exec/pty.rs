//! A pseudo-terminal for `pty-req` execs: the slave becomes the child's stdio and controlling
//! terminal; the master is read and written asynchronously here.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::pty::{OpenptyResult, Winsize, openpty};
use tokio::io::unix::AsyncFd;

/// The three slave descriptors to hand to the child.
pub struct Slave {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

pub struct Master {
    fd: AsyncFd<OwnedFd>,
}

fn winsize(cols: u32, rows: u32) -> Winsize {
    // A 0x0 size (what ExecSandbox sends) would make full-screen programs divide by zero;
    // the real server bumps it to 1x1 too.
    let clamp = |v: u32| u16::try_from(v.max(1)).unwrap_or(u16::MAX);
    Winsize {
        ws_row: clamp(rows),
        ws_col: clamp(cols),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

pub fn open(cols: u32, rows: u32) -> io::Result<(Master, Slave)> {
    let OpenptyResult { master, slave } = openpty(Some(&winsize(cols, rows)), None)?;
    let flags = OFlag::from_bits_truncate(fcntl(master.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(master.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    let slave = Slave {
        stdout: slave.try_clone()?,
        stderr: slave.try_clone()?,
        stdin: slave,
    };
    // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the descriptor is valid, stays
    // open and keeps referring to the same pty master until the AsyncFd is dropped.
    let fd = unsafe { AsyncFd::register(master) }.map_err(|e| e.into_parts().1)?;
    Ok((Master { fd }, slave))
}

/// The end of our input, told to whatever reads the slave as a terminal's user tells it: the
/// line discipline's VEOF character (^D unless the child changed it), as `script` does.
/// `last` is the last byte written before it (`None`: nothing was).
///
/// In canonical mode VEOF ends a read: at the start of a line that read returns 0, which every
/// program takes for end of file; after a partial line it only hands that line over, so a
/// second VEOF follows. In non-canonical mode it is one byte of input, which programs that
/// read a terminal raw (shells, REPLs) take for end of input themselves. `fd` may be
/// non-blocking.
pub fn write_eof(fd: std::os::fd::BorrowedFd<'_>, last: Option<u8>) -> io::Result<()> {
    use nix::sys::termios::{InputFlags, LocalFlags, SpecialCharacterIndices as Cc, tcgetattr};
    // TCGETS on a master reads the slave's settings: the child's, as it left them.
    let t = tcgetattr(fd)?;
    let cc = |i: Cc| t.control_chars[i as usize];
    // 0 is _POSIX_VDISABLE: a child that disabled VEOF gets the conventional ^D.
    let eof = match cc(Cc::VEOF) {
        0 => 0x04,
        c => c,
    };
    let canonical = t.local_flags.contains(LocalFlags::ICANON);
    let ends_line = |b: u8| {
        b == b'\n'
            || (b == b'\r'
                && t.input_flags.contains(InputFlags::ICRNL)
                && !t.input_flags.contains(InputFlags::IGNCR))
            || b == eof
            || (b != 0 && (b == cc(Cc::VEOL) || b == cc(Cc::VEOL2)))
    };
    let partial_line = canonical && last.is_some_and(|b| !ends_line(b));
    let bytes = [eof, eof];
    write_all_fd(fd, &bytes[..if partial_line { 2 } else { 1 }])
}

/// Write all of `data` to `fd`, waiting in poll(2) while a non-blocking `fd` is full.
pub fn write_all_fd(fd: std::os::fd::BorrowedFd<'_>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => {
                let mut pfd = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLOUT)];
                let _ = nix::poll::poll(&mut pfd, nix::poll::PollTimeout::NONE);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl Master {
    /// Read output. `Ok(0)` once every slave descriptor is closed (Linux reports EIO then).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(io::Error::from)) {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Another descriptor of the master (non-blocking, as this one), for a writer thread.
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.fd.get_ref().try_clone()
    }

    pub fn resize(&self, cols: u32, rows: u32) -> io::Result<()> {
        let ws = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads one `struct winsize` from the pointer, which points at a
        // live, initialised value for the duration of the call; the fd is a pty master we own.
        let rc = unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
