//! A command's C data, built before the fork: where its program may be, its environment, and
//! the ends of its standard streams (the child's, and ours when they are pipes).

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::RunError;
use super::spec::{SpawnSpec, Stdio};
use super::supervisor::Supervisor;
use crate::sandbox;
use crate::sandbox::init::ExecPlan;

/// One command, ready for the fork.
pub(super) struct Parts {
    pub(super) plan: ExecPlan,
    /// Our ends of the child's stdin, stdout and stderr, where they are pipes.
    pub(super) parents: [Option<OwnedFd>; 3],
    pub(super) candidates: Vec<PathBuf>,
    pub(super) cwd: PathBuf,
    pub(super) argv0: OsString,
    /// What `plan` was built from, but its standard streams: to build it again (see
    /// [`Parts::into_spec`]).
    spec: SpawnSpec,
}

impl Parts {
    /// `spec`'s command of `supervisor` in a sandbox whose workdir is `workdir` and whose view
    /// has a private /tmp (`private_tmp`).
    pub(super) fn new(
        supervisor: &Supervisor,
        spec: SpawnSpec,
        workdir: &Path,
        private_tmp: bool,
    ) -> Result<Parts, RunError> {
        let Some(argv0) = spec.argv.first().cloned() else {
            return Err(RunError::Usage("empty command".into()));
        };
        // Whether it exists is the child's to find out, in the view (a host directory outside
        // the grants does not exist there either, and the host's answer must not show).
        let cwd = spec.cwd.clone().unwrap_or_else(|| workdir.to_path_buf());
        let candidates = match &spec.program_fd {
            // Exec'd through the fd (execveat); the path is only a name for errors.
            Some(_) => vec![PathBuf::from("/proc/self/exe")],
            None => program_candidates(&argv0, &spec.env, &cwd)?,
        };
        let mut env = spec.env.clone();
        // The view's /tmp is the child's own, writable temp space.
        if private_tmp && !env.iter().any(|(k, _)| k == "TMPDIR") {
            env.push(("TMPDIR".into(), "/tmp".into()));
        }
        let SpawnSpec {
            argv,
            env: spec_env,
            cwd: spec_cwd,
            stdin,
            stdout,
            stderr,
            controlling_tty,
            program_fd,
        } = spec;
        let (stdin_child, stdin_parent) = child_end(stdin, true)?;
        let (stdout_child, stdout_parent) = child_end(stdout, false)?;
        let (stderr_child, stderr_parent) = child_end(stderr, false)?;
        let plan = ExecPlan::new(
            &candidates,
            &argv,
            &env,
            &cwd,
            [stdin_child, stdout_child, stderr_child],
            supervisor.command_group(controlling_tty),
            program_fd.clone(),
        )
        .and_then(|p| p.with_workdir(workdir))
        .map_err(|_| RunError::Usage("an argument or variable contains a NUL byte".into()))?;
        Ok(Parts {
            plan,
            parents: [stdin_parent, stdout_parent, stderr_parent],
            candidates,
            cwd,
            argv0,
            spec: SpawnSpec {
                argv,
                env: spec_env,
                cwd: spec_cwd,
                stdin: Stdio::Null,
                stdout: Stdio::Null,
                stderr: Stdio::Null,
                controlling_tty,
                program_fd,
            },
        })
    }

    /// The spec again, its streams the child's ends made for this plan, and our ends of them:
    /// for a spawn of another kind than the one this plan was made for.
    pub(super) fn into_spec(self) -> (SpawnSpec, [Option<OwnedFd>; 3]) {
        let [i, o, e] = self.plan.into_stdio();
        let spec = SpawnSpec {
            stdin: Stdio::Fd(i),
            stdout: Stdio::Fd(o),
            stderr: Stdio::Fd(e),
            ..self.spec
        };
        (spec, self.parents)
    }
}

/// The child's end of one stdio stream, and ours when it is a pipe.
pub(super) fn child_end(s: Stdio, stdin: bool) -> Result<(OwnedFd, Option<OwnedFd>), RunError> {
    match s {
        Stdio::Fd(fd) => Ok((fd, None)),
        // Read-only as stdin, write-only as output, as a shell's `< /dev/null` and `> /dev/null`
        // give it: a write to stdin is EBADF. On a read-only mount (sandbox::devnull).
        Stdio::Null => sandbox::devnull::open(!stdin)
            .map(|f| (OwnedFd::from(f), None))
            .map_err(|source| RunError::Io {
                what: "opening /dev/null",
                source,
            }),
        Stdio::Piped => {
            let (r, w) = cloexec_pipe()?;
            Ok(if stdin { (r, Some(w)) } else { (w, Some(r)) })
        }
    }
}

fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), RunError> {
    crate::sys::pipe(0).map_err(|source| RunError::Io {
        what: "creating a pipe",
        source,
    })
}

/// Where argv[0] may be, in the order the child tries them (see `ExecPlan`): a name with a
/// `/` is used as is, anything else is joined to each entry of the child's PATH, as the shell
/// searches. A relative name or PATH entry is relative to `cwd`, the directory the child will
/// run in, not to ours: `run --workdir W -- ./x.sh` means `W/x.sh` wherever `run` was started.
/// Nothing here looks at the filesystem: the child searches in the view.
pub fn program_candidates(
    argv0: &OsStr,
    env: &[(OsString, OsString)],
    cwd: &Path,
) -> Result<Vec<PathBuf>, RunError> {
    let name = argv0.as_bytes();
    if name.is_empty() {
        return Err(RunError::NotFound(String::new()));
    }
    // join keeps an absolute name as it is; components() drops the `.` of `./x` (never a
    // `..`, which only the lookup may resolve).
    let clean = |p: PathBuf| p.components().collect::<PathBuf>();
    if name.contains(&b'/') {
        return Ok(vec![clean(cwd.join(argv0))]);
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    let mut out: Vec<PathBuf> = Vec::new();
    for dir in path.as_bytes().split(|&b| b == b':') {
        // An empty entry is the current directory, as in every shell.
        let cand = clean(cwd.join(OsStr::from_bytes(dir)).join(argv0));
        if !out.contains(&cand) {
            out.push(cand);
        }
    }
    if out.len() > crate::sandbox::diagnose::MAX_CANDIDATES {
        return Err(RunError::Usage(format!(
            "PATH has more than {} entries",
            crate::sandbox::diagnose::MAX_CANDIDATES
        )));
    }
    Ok(out)
}
