//! Why a command could not start, in words: a path outside the grants, a directory the
//! sandbox uid may not search, a missing interpreter.

use super::*;

/// Turn a refused execve into a message that says what happened: a program (or the
/// interpreter of its `#!` line) outside every grant was refused by Landlock, not by its mode;
/// a script whose interpreter is missing is not itself "not found".
///
/// "Not granted" is said only where the sandbox identity could execute the file by its
/// permissions (asked of the kernel as that identity): for a file below a directory of mode
/// 0700, say, `--ro` would not help.
pub(super) fn explain_spawn_error(err: RunError, fs: &FsPolicy, who: Option<Identity>) -> RunError {
    let landlock_refused =
        |p: &Path| p.exists() && !granted(fs, p) && workdir::can_access(p, who, libc::X_OK).is_ok();
    match err {
        RunError::NotExecutable { path, source } if source.raw_os_error() == Some(libc::EACCES) => {
            // The program itself first: the kernel checks it before its interpreter.
            let program = fs.workdir.join(&path);
            let blocked = if landlock_refused(&program) {
                Some(program.clone())
            } else {
                shebang(&program).filter(|i| landlock_refused(i))
            };
            if let Some(blocked) = blocked {
                return RunError::NotGranted {
                    grant: blocked.parent().unwrap_or(&blocked).to_path_buf(),
                    program: path,
                    blocked,
                    source,
                };
            }
            // The permissions, then: the first directory on the way (or the file) the
            // sandbox uid may not search (execute).
            let blocker = who.and_then(|id| {
                let mut chain: Vec<&Path> = program.ancestors().collect();
                chain.reverse();
                chain
                    .into_iter()
                    .find(|p| workdir::can_access(p, Some(id), libc::X_OK).is_err())
                    .map(|p| (id, p.to_path_buf()))
            });
            match blocker {
                Some((id, blocker)) => {
                    use std::os::unix::fs::MetadataExt;
                    let meta = std::fs::metadata(&blocker).ok();
                    RunError::NotPermitted {
                        program: path,
                        uid: id.uid,
                        owner: meta.as_ref().map_or(u32::MAX, |m| m.uid()),
                        mode: meta.as_ref().map_or(0, |m| m.mode() & 0o7777),
                        blocker,
                        source,
                    }
                }
                None => RunError::NotExecutable { path, source },
            }
        }
        RunError::NotFound(name) if name.contains('/') => {
            // execve's ENOENT names the program even when what is missing is its interpreter.
            // And with the view's own root, a path outside the grants does not exist inside at
            // all: ENOENT where Landlock alone answered EACCES. Explain those as the refusal
            // they are (not granted, or not permitted to the sandbox uid anyway).
            let script = fs.workdir.join(&name);
            let refused = |p: &Path| p.exists() && !granted(fs, p);
            let as_refused = || {
                explain_spawn_error(
                    RunError::NotExecutable {
                        path: PathBuf::from(&name),
                        source: std::io::Error::from_raw_os_error(libc::EACCES),
                    },
                    fs,
                    who,
                )
            };
            if refused(&script) {
                return as_refused();
            }
            match shebang(&script) {
                Some(i) if script.is_file() && !i.exists() => RunError::InterpreterNotFound {
                    script: PathBuf::from(name),
                    interpreter: i,
                },
                Some(i) if script.is_file() && refused(&i) => as_refused(),
                _ => RunError::NotFound(name),
            }
        }
        other => other,
    }
}

/// The interpreter named on the `#!` line of `path`, when it has one.
pub(super) fn shebang(path: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    text.split_whitespace().next().map(PathBuf::from)
}

/// Whether a grant of `fs` covers `path` (as resolved now; for messages only).
pub(super) fn granted(fs: &FsPolicy, path: &Path) -> bool {
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let roots = fs
        .system
        .iter()
        .chain(&fs.read_only)
        .chain(&fs.read_write)
        .chain(std::iter::once(&fs.workdir))
        .chain(&fs.devices);
    let denied = fs
        .deny
        .iter()
        .any(|d| real.starts_with(d.canonicalize().unwrap_or_else(|_| d.clone())));
    !denied
        && roots
            .map(|r| r.canonicalize().unwrap_or_else(|_| r.clone()))
            .any(|r| real.starts_with(r))
}
