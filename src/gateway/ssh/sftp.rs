//! The `sftp` subsystem without anything in the image: the channel runs
//! `openshell-sandbox sftp-server`, our own binary in a hidden mode, as an ordinary sandboxed
//! exec whose stdin and stdout are the channel. So the SFTP server is confined exactly like
//! any exec: every file it opens is opened by a process under the same Landlock rules, uid,
//! seccomp filter and limits. Nothing here checks paths; the kernel does.
//!
//! The binary lives in /opt/openshell, which the sandbox may never read, and Landlock checks
//! READ_FILE and EXECUTE on the file an execve opens, even through execveat(fd, "",
//! AT_EMPTY_PATH). So the supervisor copies its own image, once and on first use, into a
//! sealed memfd, and the child execs that fd: a memfd lives on the kernel's internal tmpfs
//! mount, which Landlock does not treat as part of the sandbox's filesystem.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use russh_sftp::protocol::{
    Attrs, Data, File as Entry, FileAttributes, Handle, Name, OpenFlags, Status, StatusCode,
    Version,
};
use russh_sftp::server::StatusReply;

use crate::exit::Exit;

/// The subsystem name clients ask for.
pub const SUBSYSTEM: &str = "sftp";
/// argv[1] of the hidden mode.
pub const MODE: &str = "sftp-server";

#[derive(Debug, thiserror::Error)]
pub enum SftpError {
    #[error("opening /proc/self/exe: {0}")]
    OpenSelf(#[source] io::Error),
    #[error("memfd_create: {0}")]
    Memfd(#[source] io::Error),
    #[error("copying the supervisor's image into the memfd: {0}")]
    Copy(#[source] io::Error),
    #[error("sealing the memfd: {0}")]
    Seal(#[source] io::Error),
}

/// An fd of this binary's image that a sandboxed child can execveat(2). Made once, on the
/// first sftp request: the copy costs the binary's size in shared memory, which a supervisor
/// that never serves sftp should not pay.
pub fn program_fd() -> Result<Arc<OwnedFd>, Arc<SftpError>> {
    static FD: OnceLock<Result<Arc<OwnedFd>, Arc<SftpError>>> = OnceLock::new();
    FD.get_or_init(|| make_program_fd().map(Arc::new).map_err(Arc::new))
        .clone()
}

fn make_program_fd() -> Result<OwnedFd, SftpError> {
    let mut exe = File::open("/proc/self/exe").map_err(SftpError::OpenSelf)?;
    let name = c"openshell-sandbox";
    // CLOEXEC: the fd reaches only the exec that runs it (the kernel holds the image open
    // once execveat has started); no other child inherits it. ALLOW_SEALING so it can be
    // made immutable below.
    // SAFETY: a NUL-terminated name and flags; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_EXEC,
        )
    };
    if fd < 0 {
        return Err(SftpError::Memfd(io::Error::last_os_error()));
    }
    // SAFETY: memfd_create just returned this fd, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut out = File::from(fd);
    io::copy(&mut exe, &mut out).map_err(SftpError::Copy)?;
    // A sandboxed child may get this fd's file back through /proc/self/exe; sealed, it cannot
    // change what the next sftp session runs.
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on an fd we own.
    if unsafe { libc::fcntl(out.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(SftpError::Seal(io::Error::last_os_error()));
    }
    Ok(OwnedFd::from(out))
}

/// The hidden `sftp-server` mode: serve SFTP v3 on stdin/stdout until the client closes.
pub fn serve_stdio() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("openshell-sandbox sftp-server: starting the runtime: {e}");
            return ExitCode::from(Exit::Failed.code());
        }
    };
    rt.block_on(async {
        let stdio = (dup(0), dup(1));
        let (Ok(rx), Ok(tx)) = stdio else {
            eprintln!("openshell-sandbox sftp-server: stdin and stdout must be open");
            return ExitCode::from(Exit::Failed.code());
        };
        let pipes = (
            tokio::net::unix::pipe::Receiver::from_owned_fd(rx),
            tokio::net::unix::pipe::Sender::from_owned_fd(tx),
        );
        let (Ok(rx), Ok(tx)) = pipes else {
            eprintln!("openshell-sandbox sftp-server: stdin and stdout must be pipes");
            return ExitCode::from(Exit::Failed.code());
        };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let server = Server {
            cwd,
            open: HashMap::new(),
            next: 0,
            _done: done_tx,
        };
        russh_sftp::server::run(tokio::io::join(rx, tx), server).await;
        // The library serves on its own task and drops the handler when the stream ends.
        let _ = done_rx.await;
        ExitCode::SUCCESS
    })
}

fn dup(fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a standard fd; the result is checked.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

enum Open {
    File(File),
    /// Entries not yet sent; `None` once they have been.
    Dir(Option<Vec<Entry>>),
}

struct Server {
    cwd: PathBuf,
    open: HashMap<String, Open>,
    next: u64,
    _done: tokio::sync::oneshot::Sender<()>,
}

/// The SFTP status for an errno: the client prints "Permission denied" or "No such file"
/// from these, so a path outside the grants reads as what it is.
fn status(e: io::Error) -> StatusReply {
    let code = match e.kind() {
        io::ErrorKind::NotFound => StatusCode::NoSuchFile,
        io::ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
        _ if e.raw_os_error() == Some(libc::EPERM) => StatusCode::PermissionDenied,
        _ => StatusCode::Failure,
    };
    code.with_message(e.to_string())
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en-US".into(),
    }
}

fn attrs_of(m: &fs::Metadata) -> FileAttributes {
    let mut a = FileAttributes::from(m);
    // The library marks every non-directory regular; the mode's type bits are the truth.
    a.permissions = Some(std::os::unix::fs::MetadataExt::mode(m));
    a
}

impl Server {
    fn path(&self, p: &str) -> PathBuf {
        if p.is_empty() {
            return self.cwd.clone();
        }
        self.cwd.join(p)
    }

    fn handle(&mut self, o: Open) -> String {
        self.next += 1;
        let h = self.next.to_string();
        self.open.insert(h.clone(), o);
        h
    }

    fn file(&self, h: &str) -> Result<&File, StatusReply> {
        match self.open.get(h) {
            Some(Open::File(f)) => Ok(f),
            _ => Err(StatusCode::Failure.with_message("invalid handle")),
        }
    }
}

fn set_attrs(path: Option<&Path>, file: Option<&File>, a: &FileAttributes) -> io::Result<()> {
    let owned;
    let f = match (file, path) {
        (Some(f), _) => f,
        (None, Some(p)) => {
            if let Some(mode) = a.permissions {
                fs::set_permissions(p, fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if a.size.is_none() && a.mtime.is_none() {
                return Ok(());
            }
            owned = fs::OpenOptions::new().write(a.size.is_some()).open(p)?;
            &owned
        }
        (None, None) => return Ok(()),
    };
    if file.is_some()
        && let Some(mode) = a.permissions
    {
        f.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
    }
    if let Some(size) = a.size {
        f.set_len(size)?;
    }
    if let (Some(at), Some(mt)) = (a.atime, a.mtime) {
        let t = |s: u32| std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::from(s));
        f.set_times(fs::FileTimes::new().set_accessed(t(at)).set_modified(t(mt)))?;
    }
    Ok(())
}

impl russh_sftp::server::Handler for Server {
    type Error = StatusReply;

    fn unimplemented(&self) -> Self::Error {
        StatusCode::OpUnsupported.into()
    }

    async fn init(
        &mut self,
        _version: u32,
        _extensions: HashMap<String, String>,
    ) -> Result<Version, Self::Error> {
        Ok(Version::new())
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        pflags: OpenFlags,
        attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let mut opts = fs::OpenOptions::from(pflags);
        if let Some(mode) = attrs.permissions {
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, mode & 0o7777);
        }
        let f = opts.open(self.path(&filename)).map_err(status)?;
        let handle = self.handle(Open::File(f));
        Ok(Handle { id, handle })
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        match self.open.remove(&handle) {
            Some(_) => Ok(ok(id)),
            None => Err(StatusCode::Failure.with_message("invalid handle")),
        }
    }

    async fn read(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        len: u32,
    ) -> Result<Data, Self::Error> {
        let f = self.file(&handle)?;
        // The client asks for at most its own buffer size; cap it so a hostile length does
        // not make us allocate gigabytes.
        let mut buf = vec![0u8; len.min(256 * 1024) as usize];
        let n = f.read_at(&mut buf, offset).map_err(status)?;
        if n == 0 && !buf.is_empty() {
            return Err(StatusCode::Eof.into());
        }
        buf.truncate(n);
        Ok(Data { id, data: buf })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        self.file(&handle)?
            .write_all_at(&data, offset)
            .map_err(status)?;
        Ok(ok(id))
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let m = fs::symlink_metadata(self.path(&path)).map_err(status)?;
        Ok(Attrs {
            id,
            attrs: attrs_of(&m),
        })
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let m = fs::metadata(self.path(&path)).map_err(status)?;
        Ok(Attrs {
            id,
            attrs: attrs_of(&m),
        })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        let m = self.file(&handle)?.metadata().map_err(status)?;
        Ok(Attrs {
            id,
            attrs: attrs_of(&m),
        })
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        set_attrs(Some(&self.path(&path)), None, &attrs).map_err(status)?;
        Ok(ok(id))
    }

    async fn fsetstat(
        &mut self,
        id: u32,
        handle: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        set_attrs(None, Some(self.file(&handle)?), &attrs).map_err(status)?;
        Ok(ok(id))
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        let dir = self.path(&path);
        let mut entries = Vec::new();
        for e in fs::read_dir(&dir).map_err(status)? {
            let e = e.map_err(status)?;
            // An entry we may not stat is still listed, with empty attributes.
            let attrs = e
                .metadata()
                .map(|m| attrs_of(&m))
                .unwrap_or_else(|_| FileAttributes::empty());
            entries.push(Entry::new(e.file_name().to_string_lossy(), attrs));
        }
        for dot in [".", ".."] {
            if let Ok(m) = fs::metadata(dir.join(dot)) {
                entries.push(Entry::new(dot, attrs_of(&m)));
            }
        }
        let handle = self.handle(Open::Dir(Some(entries)));
        Ok(Handle { id, handle })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        match self.open.get_mut(&handle) {
            Some(Open::Dir(entries)) => match entries.take() {
                Some(files) => Ok(Name { id, files }),
                None => Err(StatusCode::Eof.into()),
            },
            _ => Err(StatusCode::Failure.with_message("invalid handle")),
        }
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        fs::remove_file(self.path(&filename)).map_err(status)?;
        Ok(ok(id))
    }

    async fn mkdir(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let mut b = fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut b, attrs.permissions.unwrap_or(0o777) & 0o7777);
        b.create(self.path(&path)).map_err(status)?;
        Ok(ok(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        fs::remove_dir(self.path(&path)).map_err(status)?;
        Ok(ok(id))
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let p = fs::canonicalize(self.path(&path)).map_err(status)?;
        Ok(Name {
            id,
            files: vec![Entry::dummy(p.to_string_lossy())],
        })
    }

    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        let (from, to) = (self.path(&oldpath), self.path(&newpath));
        // SSH_FXP_RENAME (v3) fails when the target exists; OpenSSH's server does the same.
        if fs::symlink_metadata(&to).is_ok() {
            return Err(StatusCode::Failure.with_message("the target exists"));
        }
        fs::rename(from, to).map_err(status)?;
        Ok(ok(id))
    }

    async fn readlink(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let t = fs::read_link(self.path(&path)).map_err(status)?;
        Ok(Name {
            id,
            files: vec![Entry::dummy(t.to_string_lossy())],
        })
    }
}
