//! "Why can't this run": the explanation of a command that could not start, through the real
//! binary, against what a hostile earlier run can plant in a workdir.
//!
//! The explanation is found out by the command's own process, inside the view and as the
//! sandbox identity, after execve failed: it looks at the program and its interpreters through
//! `O_PATH` descriptors and fstat, and reads an ELF header or `#!` line only from a regular file.
//! So a FIFO named as the command never blocks the run, a link to a device never opens it, and
//! a path outside the grants gets the same answer whether or not it exists on the host.

mod support;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::text;
use support::{BIN, Workdir, require_root};

/// `run --workdir W [extra] -- cmd`, killed (and the test failed) if it takes over `limit`.
fn run_bounded(wd: &Workdir, extra: &[&str], cmd: &[&str], limit: Duration) -> Output {
    run_bounded_with(wd, extra, cmd, limit, |_| {}).0
}

fn run_bounded_with(
    wd: &Workdir,
    extra: &[&str],
    cmd: &[&str],
    limit: Duration,
    setup: impl FnOnce(&mut Command),
) -> (Output, i32) {
    let mut c = Command::new(BIN);
    c.arg("run")
        .arg("--workdir")
        .arg(wd.path())
        .args(extra)
        .arg("--")
        .args(cmd)
        .current_dir(wd.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    setup(&mut c);
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), pid);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "run {cmd:?} did not end within {limit:?}; stderr so far:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mkfifo(p: &Path) {
    let c = CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o755) };
    assert_eq!(rc, 0, "mkfifo {p:?}");
}

/// A FIFO named as the command: nothing may open it (an open for read blocks until a writer
/// comes), so the run ends at once with an error that says what it is, with or without
/// `--timeout`.
#[test]
fn a_fifo_named_as_the_command_ends_the_run_promptly_with_a_clear_error() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    mkfifo(&wd.path().join("build.sh"));
    for extra in [&["--timeout", "5"][..], &[][..]] {
        let t0 = Instant::now();
        let out = run_bounded(&wd, extra, &["./build.sh"], Duration::from_secs(20));
        let err = text(&out.stderr);
        eprintln!("{extra:?}: {:?}: {err}", t0.elapsed());
        assert_eq!(out.status.code(), Some(126), "{err}");
        assert!(err.contains("build.sh"), "{err}");
        assert!(err.contains("is a FIFO, not a program file"), "{err}");
    }
    // Through PATH too: the search in the view passes over it.
    let out = run_bounded(
        &wd,
        &[
            "--env",
            &format!("PATH={}:/usr/bin:/bin", wd.path().display()),
        ],
        &["build.sh"],
        Duration::from_secs(20),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains("is a FIFO, not a program file"), "{err}");
}

/// An inotify IN_OPEN watch on one file: whether anyone opened that inode.
struct OpenWatch(OwnedFd);

impl OpenWatch {
    fn new(path: &Path) -> OpenWatch {
        // SAFETY: plain flags; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let c = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path, a descriptor we own.
        let w = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_OPEN) };
        assert!(
            w >= 0,
            "inotify_add_watch {path:?}: {}",
            std::io::Error::last_os_error()
        );
        OpenWatch(fd)
    }

    /// How many opens were seen so far.
    fn opens(&self) -> usize {
        let mut n = 0;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reading into our buffer.
            let r = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                return n;
            }
            let mut off = 0usize;
            while off + std::mem::size_of::<libc::inotify_event>() <= r as usize {
                // SAFETY: the kernel wrote whole event records; read unaligned.
                let e: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf.as_ptr().add(off).cast()) };
                n += usize::from(e.mask & libc::IN_OPEN != 0);
                off += std::mem::size_of::<libc::inotify_event>() + e.len as usize;
            }
        }
    }
}

/// Give the child a controlling terminal (a pty of ours), so that /dev/tty opens for it.
fn with_controlling_tty(c: &mut Command) -> OwnedFd {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two descriptors.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: fresh descriptors that nothing else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let s = slave.as_raw_fd();
    // SAFETY: setsid and ioctl are async-signal-safe; the slave stays open in the child.
    unsafe {
        c.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(s, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    std::mem::forget(slave);
    master
}

/// A link to a device named as the command, left in the workdir by an earlier run: no process
/// of the run opens it, though it would open (the run has a controlling terminal, and the node
/// is the terminal device /dev/tty is, 5:0). And a link to /dev/tty itself gets the same
/// answer.
#[test]
fn a_link_to_a_device_named_as_the_command_is_never_opened() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let dev = wd.path().join("tty-node");
    let c = CString::new(dev.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(5, 0)) };
    assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
    std::os::unix::fs::symlink("tty-node", wd.path().join("build.sh")).unwrap();
    std::os::unix::fs::symlink("/dev/tty", wd.path().join("tty.sh")).unwrap();

    for cmd in ["./build.sh", "./tty.sh"] {
        let watch = OpenWatch::new(&dev);
        let mut master = None;
        let (out, _) = run_bounded_with(&wd, &[], &[cmd], Duration::from_secs(20), |c| {
            master = Some(with_controlling_tty(c))
        });
        let err = text(&out.stderr);
        if cmd == "./build.sh" {
            let opens = watch.opens();
            assert_eq!(opens, 0, "the device node was opened: {err}");
        }
        assert_eq!(out.status.code(), Some(126), "{cmd}: {err}");
        assert!(
            err.contains("is a character device, not a program file"),
            "{cmd}: {err}"
        );
        drop(master);
    }
}

/// The answer for a path outside the grants, with the path itself replaced by `<P>`.
fn answer(wd: &Workdir, extra: &[&str], cmd: &str, shown: &str) -> (Option<i32>, String) {
    let out = run_bounded(wd, extra, &[cmd], Duration::from_secs(20));
    (out.status.code(), text(&out.stderr).replace(shown, "<P>"))
}

/// Outside the grants, a program, a directory, a FIFO and an interpreter that exist on the host
/// get the same answer as ones that do not: the run tells nothing about the host beyond the
/// view.
#[test]
fn a_path_outside_the_grants_gets_the_same_answer_whether_or_not_it_exists_on_the_host() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // In /tmp, which is the view's own tmpfs: nothing of the host's /tmp but the workdir is
    // in the view.
    let outside = tempfile::Builder::new()
        .prefix("osb-outside-")
        .tempdir()
        .unwrap();
    let o = outside.path();
    std::fs::set_permissions(o, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy("/bin/true", o.join("prog")).unwrap();
    std::fs::set_permissions(o.join("prog"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(o.join("dir")).unwrap();
    mkfifo(&o.join("fifo"));
    std::fs::copy("/bin/sh", o.join("interp")).unwrap();
    std::fs::set_permissions(o.join("interp"), std::fs::Permissions::from_mode(0o755)).unwrap();

    let absent = o.join("absent");
    let absent_s = absent.to_str().unwrap();
    let want = answer(&wd, &[], absent_s, absent_s);
    assert_eq!(want.0, Some(127), "{}", want.1);
    for name in ["prog", "dir", "fifo", "interp"] {
        let p = o.join(name);
        let got = answer(&wd, &[], p.to_str().unwrap(), p.to_str().unwrap());
        assert_eq!(got, want, "{name} exists on the host, outside the grants");
    }

    // A script in the workdir whose `#!` names an interpreter outside the grants.
    for (script, interp) in [("has.sh", o.join("interp")), ("none.sh", absent.clone())] {
        let s = wd.path().join(script);
        std::fs::write(&s, format!("#!{}\necho ran\n", interp.display())).unwrap();
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let i = o.join("interp");
    let has = answer(&wd, &[], "./has.sh", i.to_str().unwrap());
    let none = answer(&wd, &[], "./none.sh", absent_s);
    assert_eq!(has.0, Some(127), "{}", has.1);
    assert_eq!(has, (none.0, none.1.replace("none.sh", "has.sh")));

    // A PATH entry outside the grants: the search happens in the view.
    let path = format!("PATH={}:/usr/bin:/bin", o.display());
    let found = answer(&wd, &["--env", &path], "prog", "prog");
    let missing = answer(&wd, &["--env", &path], "absent", "absent");
    assert_eq!(found.0, Some(127), "{}", found.1);
    assert_eq!(found, missing);
}
