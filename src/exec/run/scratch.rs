//! `run`'s private storage: the `--scratch` directory, and the HOME its command gets.

use std::path::PathBuf;

use crate::cli::RunArgs;
use crate::exec::RunError;
use crate::exec::home::HomeRequest;
use crate::policy::Identity;

/// A fresh scratch directory, owned by the sandbox identity, removed on drop.
pub(super) struct Scratch {
    pub(super) path: PathBuf,
}

impl Scratch {
    pub(super) fn create(owner: Option<Identity>) -> Result<Scratch, RunError> {
        let base = std::env::temp_dir();
        let io = |what, source| RunError::Io { what, source };
        for _ in 0..16 {
            let name = format!(
                "openshell-scratch-{}-{:016x}",
                std::process::id(),
                crate::sys::random_u64()
            );
            let path = base.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                        .map_err(|e| io("setting scratch dir permissions", e))?;
                    if let Some(id) = owner {
                        // Never follows a link: the directory is ours, fresh, in a sticky dir.
                        std::os::unix::fs::lchown(&path, Some(id.uid), Some(id.gid))
                            .map_err(|e| io("giving the scratch dir to the sandbox uid", e))?;
                    }
                    return Ok(Scratch { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io("creating the scratch dir", e)),
            }
        }
        Err(io(
            "creating the scratch dir",
            std::io::Error::from_raw_os_error(libc::EEXIST),
        ))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the scratch dir");
        }
    }
}

/// What the command's HOME is to be (exec/home.rs): `None` when `--env HOME=...` (or
/// `--inherit-env HOME`) chooses another, and then nothing is made. `root`: we switch to
/// `child` (the directory is given to it).
pub(super) fn home_request(
    args: &RunArgs,
    root: bool,
    child: (u32, u32),
    scratch: Option<&Scratch>,
) -> Option<HomeRequest> {
    if args.env.iter().any(|(k, _)| k == "HOME") || args.inherit_env.iter().any(|k| k == "HOME") {
        return None;
    }
    Some(HomeRequest {
        owner: root.then_some(Identity {
            uid: child.0,
            gid: child.1,
        }),
        scratch: scratch.map(|s| s.path.clone()),
    })
}
