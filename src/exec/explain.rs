//! Why a command could not start, in words: a program not in the view, a FIFO or device named
//! as one, a directory the sandbox uid may not search, an interpreter outside the grants.
//!
//! The facts come from the command's own process, which examined the program inside the view
//! as the sandbox identity after its execve failed (`sandbox/diagnose.rs`); `check` gets the
//! same examination from its probe. The supervisor adds only what the policy says (whether a
//! grant covers a path, which grant would add an interpreter), never what the host holds
//! outside the view: a path outside the grants gets one answer whether or not it exists there.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use super::RunError;
use super::missing_interpreter::MissingInterpreter;
use crate::policy::{FsPolicy, PathAccess};
use crate::sandbox::ChildError;
use crate::sandbox::diagnose::{Diagnosis, Finding, Interp};

/// What the explanation may use besides the examination: the command as given and the policy.
pub struct Context<'a> {
    pub argv0: &'a OsStr,
    /// The paths the child tried, in order (`program_candidates`).
    pub candidates: &'a [PathBuf],
    pub fs: &'a FsPolicy,
    /// The Landlock rules as installed (path, access, is a directory): the grants, resolved.
    pub rules: &'a [(PathBuf, PathAccess, bool)],
    /// The uid the command runs as.
    pub uid: u32,
}

/// The error for a failed execve (`error`, whose detail byte is the candidate that decided it)
/// and the command's examination of it (`None` when none came in time).
pub fn exec_failed(error: ChildError, d: Option<&Diagnosis>, cx: &Context<'_>) -> RunError {
    let name = cx.argv0.to_string_lossy().into_owned();
    let source = io::Error::from_raw_os_error(error.errno);
    let Some(d) = d else {
        if error.errno != libc::EACCES && error.errno != libc::ENOEXEC && error.errno != 0 {
            tracing::warn!(
                "the command did not explain its failed execve in time ({})",
                source
            );
        }
        return match error.errno {
            libc::ENOENT => RunError::NotFound(name),
            _ => RunError::NotExecutable {
                path: cx
                    .candidates
                    .get(usize::from(error.detail))
                    .cloned()
                    .unwrap_or_else(|| PathBuf::from(&name)),
                source,
            },
        };
    };
    let program = d
        .candidate
        .and_then(|i| cx.candidates.get(i))
        .cloned()
        .unwrap_or_else(|| PathBuf::from(&name));
    match d.finding {
        Finding::NotFound => match cx.candidates {
            [only] if name.contains('/') && !covered(cx, only) => RunError::NotInView {
                program: only.clone(),
            },
            _ => RunError::NotFound(name),
        },
        Finding::NotRegular => RunError::NotAProgram {
            subject: if d.holder.is_some() {
                d.subject.clone()
            } else {
                program.clone()
            },
            program,
            what: file_kind(d.mode),
        },
        // Nobody may execute it: the execute bit is missing, whoever runs it.
        Finding::NoExecute if d.holder.is_none() && d.mode & 0o111 == 0 => RunError::NoExecuteBit {
            interpreter: interpreter_by_name(&program),
            program,
            shown: name,
            mode: d.mode & 0o7777,
            source: io::Error::from_raw_os_error(libc::EACCES),
        },
        Finding::NoSearch | Finding::NoExecute => RunError::NotPermitted {
            blocker: if d.finding == Finding::NoSearch {
                d.at.clone()
            } else if d.holder.is_some() {
                d.subject.clone()
            } else {
                program.clone()
            },
            program,
            search: d.finding == Finding::NoSearch,
            uid: cx.uid,
            owner: d.owner,
            mode: d.mode & 0o7777,
            source: io::Error::from_raw_os_error(libc::EACCES),
        },
        Finding::InterpreterMissing => {
            RunError::InterpreterNotFound(Box::new(MissingInterpreter {
                holder: d
                    .holder
                    .clone()
                    .filter(|h| !same_file(h, &program))
                    .unwrap_or_else(|| program.clone()),
                program,
                interpreter: d.subject.clone(),
                elf: d.interp == Some(Interp::Elf),
                missing: d.at.clone(),
                grant: d
                    .full
                    .parent()
                    .filter(|p| *p != Path::new("/"))
                    .unwrap_or(&d.full)
                    .to_path_buf(),
                leads_to: d.full.clone(),
            }))
        }
        Finding::Unexplained | Finding::Startable => match d.errno {
            // The program is there; what it needs could not be read in the view.
            libc::ENOENT if d.unreadable => RunError::NotExecutable {
                path: program,
                source,
            },
            libc::ENOENT => RunError::NotFound(name),
            libc::EACCES => RunError::Refused {
                subject: if d.holder.is_some() {
                    d.subject.clone()
                } else {
                    program.clone()
                },
                program,
                noexec: d.noexec,
                source,
            },
            e => RunError::NotExecutable {
                path: program,
                source: io::Error::from_raw_os_error(e),
            },
        },
    }
}

/// The interpreter a script's file name suggests, for the message about a missing execute
/// bit (only the name is used: the file is not read again).
fn interpreter_by_name(program: &Path) -> Option<&'static str> {
    let ext = program.extension()?.to_str()?;
    Some(match ext {
        "py" => "python3",
        "sh" => "sh",
        "bash" => "bash",
        "js" | "mjs" | "cjs" => "node",
        "rb" => "ruby",
        "pl" => "perl",
        "php" => "php",
        "lua" => "lua",
        "r" | "R" => "Rscript",
        _ => return None,
    })
}

/// Whether a grant of the policy covers `path`, as the policy names its grants or as they were
/// resolved for Landlock. Nothing on the host is looked at.
fn covered(cx: &Context<'_>, path: &Path) -> bool {
    let fs = cx.fs;
    let named = fs
        .system
        .iter()
        .chain(&fs.read_only)
        .chain(&fs.read_write)
        .chain(std::iter::once(&fs.workdir))
        .chain(&fs.devices);
    let denied = fs.deny.iter().any(|d| path.starts_with(d));
    !denied
        && (named.into_iter().any(|g| path.starts_with(g))
            || cx.rules.iter().any(|(r, _, _)| path.starts_with(r)))
}

fn same_file(a: &Path, b: &Path) -> bool {
    a.components().eq(b.components())
}

/// What a file of `mode` is, for "X is a FIFO, not a program file".
fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFDIR => "a directory",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symlink",
        _ => "not a regular file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Step;

    fn diag(finding: Finding) -> Diagnosis {
        Diagnosis {
            finding,
            candidate: Some(0),
            subject: PathBuf::from("/w/x"),
            holder: None,
            interp: None,
            at: PathBuf::new(),
            full: PathBuf::new(),
            mode: 0,
            owner: 0,
            errno: 0,
            noexec: false,
            truncated: false,
            unreadable: false,
        }
    }

    fn explain(d: &Diagnosis, argv0: &str, candidates: &[&str]) -> RunError {
        let fs = FsPolicy::with_defaults(PathBuf::from("/w"));
        let candidates: Vec<PathBuf> = candidates.iter().map(PathBuf::from).collect();
        let cx = Context {
            argv0: OsStr::new(argv0),
            candidates: &candidates,
            fs: &fs,
            rules: &[],
            uid: 1000,
        };
        exec_failed(ChildError::new(Step::Exec, libc::ENOENT), Some(d), &cx)
    }

    #[test]
    fn a_missing_loader_names_itself_its_first_missing_component_and_the_grant() {
        let mut d = diag(Finding::InterpreterMissing);
        d.subject = PathBuf::from("/lib64/ld-linux-x86-64.so.2");
        d.holder = Some(PathBuf::from("/usr/bin/python3"));
        d.interp = Some(Interp::Elf);
        d.at = PathBuf::from("/lib64");
        d.full = d.subject.clone();
        let e = explain(
            &d,
            "python3",
            &["/usr/local/bin/python3", "/usr/bin/python3"],
        );
        d.candidate = Some(1);
        let e2 = explain(
            &d,
            "python3",
            &["/usr/local/bin/python3", "/usr/bin/python3"],
        );
        assert_eq!(e.exit_code(), 127);
        let msg = e2.to_string();
        assert_eq!(
            msg,
            "/usr/bin/python3: cannot start: its ELF interpreter /lib64/ld-linux-x86-64.so.2 is \
             not in the sandbox's view (/lib64 does not exist there); grant /lib64 to add it \
             (`--ro /lib64`, or read_only in the policy)"
        );
        // Through links to somewhere else: where they led, and the directory holding that.
        d.at = PathBuf::from("/lib");
        d.full = PathBuf::from("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
        let msg = explain(&d, "python3", &["/usr/bin/python3"]).to_string();
        assert!(
            msg.contains(
                "(it leads to /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; /lib does not \
                 exist there); grant /lib/x86_64-linux-gnu"
            ),
            "{msg}"
        );
    }

    #[test]
    fn a_script_keeps_the_shells_words_for_a_bad_interpreter() {
        let mut d = diag(Finding::InterpreterMissing);
        d.subject = PathBuf::from("/opt/py/bin/python3");
        d.holder = Some(PathBuf::from("/w/s.py"));
        d.interp = Some(Interp::Script);
        d.at = PathBuf::from("/opt/py");
        d.full = d.subject.clone();
        let msg = explain(&d, "./s.py", &["/w/s.py"]).to_string();
        assert!(
            msg.starts_with(
                "/w/s.py: bad interpreter: /opt/py/bin/python3 not found in the sandbox's view \
                 (named on its `#!` line; /opt/py does not exist there)"
            ),
            "{msg}"
        );
        assert!(msg.contains("grant /opt/py/bin"), "{msg}");
    }

    #[test]
    fn not_found_says_no_grant_covers_a_path_only_from_the_policy() {
        let d = diag(Finding::NotFound);
        // Under the workdir (a grant): plainly not found.
        let e = explain(&d, "./gone", &["/w/gone"]);
        assert_eq!(e.to_string(), "./gone: command not found");
        // Under no grant: the same answer whatever the host holds there.
        let e = explain(&d, "/srv/x/tool", &["/srv/x/tool"]);
        assert_eq!(e.exit_code(), 127);
        assert!(e.to_string().contains("none covers it"), "{e}");
        // A name searched in PATH.
        let e = explain(&d, "tool", &["/usr/bin/tool", "/bin/tool"]);
        assert_eq!(e.to_string(), "tool: command not found");
    }

    #[test]
    fn a_fifo_or_device_is_named_as_such() {
        let mut d = diag(Finding::NotRegular);
        d.mode = libc::S_IFIFO | 0o755;
        let e = explain(&d, "./build.sh", &["/w/build.sh"]);
        assert_eq!(e.exit_code(), 126);
        assert_eq!(
            e.to_string(),
            "/w/build.sh: cannot execute: /w/build.sh is a FIFO, not a program file"
        );
        d.mode = libc::S_IFCHR | 0o666;
        assert!(
            explain(&d, "./build.sh", &["/w/build.sh"])
                .to_string()
                .contains("is a character device, not a program file")
        );
    }
}
