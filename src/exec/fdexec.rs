//! exec through an fd instead of a path (the `sftp-server` mode runs our own binary, which
//! the sandbox may not open by name): argv and envp prepared before fork, one raw
//! execveat(2) in the child.

use std::ffi::CString;
use std::io;

/// argv and envp for execveat(2), built before fork (nothing may allocate after it).
pub struct ExecImage {
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into `_strings`, owned by the same value and never mutated; they
// are only read (by execveat in the forked child).
unsafe impl Send for ExecImage {}
// SAFETY: as above: immutable after construction.
unsafe impl Sync for ExecImage {}

impl ExecImage {
    pub fn new(
        argv: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> io::Result<ExecImage> {
        use std::os::unix::ffi::OsStrExt;
        let cstr =
            |b: Vec<u8>| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
        let args: Vec<CString> = argv
            .iter()
            .map(|a| cstr(a.as_bytes().to_vec()))
            .collect::<io::Result<_>>()?;
        let envs: Vec<CString> = env
            .iter()
            .map(|(k, v)| {
                let mut b = k.as_bytes().to_vec();
                b.push(b'=');
                b.extend_from_slice(v.as_bytes());
                cstr(b)
            })
            .collect::<io::Result<_>>()?;
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let (argv, envp) = (ptrs(&args), ptrs(&envs));
        let mut strings = args;
        strings.extend(envs);
        Ok(ExecImage {
            _strings: strings,
            argv,
            envp,
        })
    }

    /// execveat(fd, "", argv, envp, AT_EMPTY_PATH). Async-signal-safe: one raw syscall on
    /// prepared data. Returns only on failure, with its errno.
    pub fn exec(&self, fd: i32) -> io::Error {
        // SAFETY: NUL-terminated arrays of pointers into strings this value owns; "" with
        // AT_EMPTY_PATH means the fd itself.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                fd,
                c"".as_ptr(),
                self.argv.as_ptr(),
                self.envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        };
        io::Error::last_os_error()
    }
}
