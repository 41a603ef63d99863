//! Escapes through the caller's terminal, through the real binary: without `--tty` the child
//! gets no terminal of the caller's (its stdin is a pipe, fed and closed), so a hostile child
//! cannot change the caller's terminal settings; with `--tty` it gets a fresh pty, and the
//! caller's terminal is restored however the run ends (exit, timeout, signal).

mod support;

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use support::*;

struct TtyState {
    termios: libc::termios,
    ldisc: libc::c_int,
    excl: libc::c_int,
    flags: libc::c_int,
}

fn tty_state(fd: i32) -> TtyState {
    // SAFETY: ioctls and fcntl on an fd we own, writing into stack values.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(fd, &mut t), 0);
        let mut ldisc = -1;
        assert_eq!(libc::ioctl(fd, libc::TIOCGETD, &mut ldisc), 0);
        let mut excl = -1;
        assert_eq!(libc::ioctl(fd, libc::TIOCGEXCL, &mut excl), 0);
        let flags = libc::fcntl(fd, libc::F_GETFL);
        TtyState {
            termios: t,
            ldisc,
            excl,
            flags,
        }
    }
}

fn same_termios(a: &libc::termios, b: &libc::termios) -> bool {
    a.c_iflag == b.c_iflag
        && a.c_oflag == b.c_oflag
        && a.c_cflag == b.c_cflag
        && a.c_lflag == b.c_lflag
        && a.c_cc == b.c_cc
}

const HOSTILE_TTY: &str = r#"
import errno, fcntl, json, os, struct, termios
res = {"isatty": os.isatty(0)}
try:
    a = termios.tcgetattr(0); a[3] &= ~termios.ECHO; termios.tcsetattr(0, termios.TCSANOW, a)
    res["echo_off"] = 0
except OSError as e:
    res["echo_off"] = e.errno
except termios.error as e:
    res["echo_off"] = e.args[0]
try:
    fcntl.ioctl(0, termios.TIOCEXCL); res["excl"] = 0
except OSError as e:
    res["excl"] = e.errno
try:
    fcntl.ioctl(0, termios.TIOCSETD, struct.pack("i", 27)); res["setd"] = 0
except OSError as e:
    res["setd"] = e.errno
fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK)
try:
    os.write(0, b"x" * 100000); res["write"] = 0
except OSError as e:
    res["write"] = e.errno
print(json.dumps(res))
"#;

#[test]
fn a_hostile_child_cannot_change_the_callers_terminal() {
    let wd = Workdir::new();
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let slave: OwnedFd = pty.slave;
    let master: OwnedFd = pty.master;
    let before = tty_state(slave.as_raw_fd());
    let out = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .args(["--", "/usr/bin/python3", "-c", HOSTILE_TTY])
        .current_dir(wd.path())
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout} {stderr}");
    let res: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let after = tty_state(slave.as_raw_fd());
    assert!(
        same_termios(&before.termios, &after.termios),
        "termios of the caller's terminal changed (child: {res})"
    );
    assert_eq!(after.ldisc, before.ldisc, "line discipline changed: {res}");
    assert_eq!(after.excl, 0, "TIOCEXCL left set: {res}");
    assert_eq!(
        after.flags & libc::O_NONBLOCK,
        before.flags & libc::O_NONBLOCK,
        "O_NONBLOCK left set: {res}"
    );
    assert_eq!(res["isatty"], false, "{res}");
    assert_eq!(
        res["write"],
        libc::EBADF,
        "fd 0 must be the read end of a pipe: {res}"
    );
    // Nothing reached the terminal behind our back.
    let mut pfd = libc::pollfd {
        fd: master.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    assert_eq!(n, 0, "the child wrote to the caller's terminal");
}

#[test]
fn stdin_is_fed_through_a_pipe_with_eof() {
    let wd = Workdir::new();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut c = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wd.path())
        .args([
            "--",
            "/usr/bin/python3",
            "-c",
            "import os,sys,hashlib; d=sys.stdin.buffer.read(); print(len(d), hashlib.sha256(d).hexdigest(), os.fstat(0).st_mode >> 12)",
        ])
        .current_dir(wd.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut w = c.stdin.take().unwrap();
    let feeder = {
        let data = data.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            w.write_all(&data).unwrap();
        })
    };
    let out = c.wait_with_output().unwrap();
    feeder.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    use sha2::Digest;
    let want = format!(
        "{} {} 1", // S_IFIFO >> 12
        data.len(),
        hex::encode(sha2::Sha256::digest(&data))
    );
    assert_eq!(
        stdout.trim(),
        want,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `run --tty` with the test's own pty as the caller's terminal; `end` ends the run once the
/// child has started: returns the exit code, and whether the caller's terminal was raw during
/// the run and is as before afterwards.
fn tty_run(extra: &[&str], script: &str, end: impl FnOnce(&Child, &Path)) -> (Option<i32>, String) {
    let wd = Workdir::new();
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let slave: OwnedFd = pty.slave;
    let _master = pty.master;
    let before = tty_state(slave.as_raw_fd());
    let mut c = Reaped(
        Command::new(BIN)
            .args(["run", "-q", "--tty", "--workdir"])
            .arg(wd.path())
            .args(extra)
            .args(["--", "/bin/sh", "-c", script])
            .current_dir(wd.path())
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for_file(&wd.path().join("ready"), 20),
        "the child never started"
    );
    // `run` makes the caller's terminal raw once it has seen the command exec (streams.rs),
    // so a command that is quick to start can write `ready` a moment before: wait for raw
    // mode, bounded, rather than read the terminal once.
    let cooked = |t: &TtyState| t.termios.c_lflag & (libc::ICANON | libc::ECHO | libc::ISIG);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut during = tty_state(slave.as_raw_fd());
    while cooked(&during) != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
        during = tty_state(slave.as_raw_fd());
    }
    assert_eq!(
        cooked(&during),
        0,
        "the caller's terminal is not raw while --tty runs"
    );
    end(&c, wd.path());
    let st = wait_exit(&mut c, 20).expect("run --tty did not exit");
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let after = tty_state(slave.as_raw_fd());
    assert!(
        same_termios(&before.termios, &after.termios),
        "the caller's termios were not restored (exit {st:?}, output {out:?})"
    );
    assert_eq!(after.ldisc, before.ldisc);
    assert_eq!(after.excl, 0);
    assert_eq!(
        after.flags & libc::O_NONBLOCK,
        before.flags & libc::O_NONBLOCK
    );
    (st.code(), out)
}

#[test]
fn tty_gives_a_fresh_pty_and_restores_the_callers_terminal() {
    // The child wrecks its own terminal: none of it reaches the caller's.
    let script = "python3 -c 'import os,sys; print(\"tty\", os.isatty(0), os.isatty(1), os.isatty(2))'; \
                  stty -echo raw; touch ready; while [ ! -e release ]; do sleep 0.01; done; echo bye";
    let (code, out) = tty_run(&[], script, |_, wd| {
        std::fs::write(wd.join("release"), b"").unwrap()
    });
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("tty True True True"), "{out:?}");
    assert!(out.contains("bye"), "{out:?}");
}

#[test]
fn tty_restores_the_callers_terminal_after_a_timeout() {
    let (code, out) = tty_run(&["--timeout", "1"], "touch ready; exec sleep 30", |_, _| {});
    assert_eq!(code, Some(124), "{out}");
}

#[test]
fn tty_restores_the_callers_terminal_after_a_signal() {
    let (code, out) = tty_run(&[], "touch ready; exec sleep 30", |c, _| {
        // SAFETY: kill with the pid of our child and a valid signal number.
        assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGTERM) }, 0);
    });
    assert_eq!(code, Some(128 + libc::SIGTERM), "{out}");
}
