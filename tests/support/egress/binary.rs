//! The real binary inside the egress world: started from the test's thread (so in the outer
//! namespace), in a private mount namespace whose `/etc/hosts` is the world's hosts file, so
//! that nothing on the machine changes; and the C helpers the hostile children are built from.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub use crate::support::BIN;

/// The binary with `hosts` as `/etc/hosts`, run in `workdir`.
pub fn osb(hosts: &Path, workdir: &Path) -> Command {
    let mut c = Command::new(BIN);
    let src = CString::new(hosts.as_os_str().as_encoded_bytes()).unwrap();
    let dst = CString::new("/etc/hosts").unwrap();
    let root = CString::new("/").unwrap();
    // SAFETY: raw syscalls only, on C strings made before the fork.
    unsafe {
        c.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.current_dir(workdir).stdin(Stdio::null());
    c
}

/// Run `c` to its end within `limit` (killed past it).
pub fn finish(mut c: Command, limit: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: kill of our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{c:?} did not finish in {limit:?}");
        }
    }
}

/// Compile C source `src` (a path) into `out` with `flags`.
pub fn cc(src: &Path, out: &Path, flags: &[&str]) {
    let st = Command::new("cc")
        .args(["-O1", "-Wall"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .unwrap();
    assert!(st.success(), "building {}", src.display());
}

/// A file of this directory.
pub fn support_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support/egress")
        .join(name)
}

pub use crate::support::skip::have_path;
