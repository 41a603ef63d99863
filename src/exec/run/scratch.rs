//! `run`'s private storage: the `--scratch` directory, and the HOME its command gets.

use std::ffi::OsString;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use crate::cli::RunArgs;
use crate::exec::{RunError, Sandbox};
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
                rand::random::<u64>()
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

/// A HOME of the run's own, gone with it, so that dotfiles and caches (`.python_history`,
/// `.cache`) land neither in the workdir nor anywhere lasting: `/tmp/home`, an empty directory
/// of the sandbox identity (`owner`) made on the view's private /tmp, else the scratch
/// directory; only a degraded run with neither keeps the workdir. `--env HOME=...` (or
/// `--inherit-env HOME`) chooses another, and then nothing is made.
pub(super) fn set_home(
    env: &mut Vec<(OsString, OsString)>,
    args: &RunArgs,
    sandbox: &Sandbox,
    owner: Option<Identity>,
    scratch: Option<&Scratch>,
) -> Result<(), RunError> {
    if args.env.iter().any(|(k, _)| k == "HOME") || args.inherit_env.iter().any(|k| k == "HOME") {
        return Ok(());
    }
    let home = match (sandbox.private_tmp(), scratch) {
        (Some(tmp), _) => make_home(tmp, owner).map_err(|source| RunError::Io {
            what: "making the command's HOME on the view's /tmp",
            source,
        })?,
        (None, Some(s)) => s.path.clone(),
        (None, None) => return Ok(()),
    };
    env.retain(|(k, _)| k != "HOME");
    env.push(("HOME".into(), home.into_os_string()));
    Ok(())
}

/// `/tmp/home` in the view (`/tmp/home.N` where a grant is bound at that name), mode 0700,
/// given to `owner`. No exec has joined the view yet, so nothing of the run's can be in the
/// way, and the calls never follow a link.
fn make_home(tmp: BorrowedFd<'_>, owner: Option<Identity>) -> std::io::Result<PathBuf> {
    use nix::fcntl::AtFlags;
    use nix::sys::stat::Mode;
    for i in 0..16 {
        let name = match i {
            0 => "home".to_owned(),
            i => format!("home.{i}"),
        };
        match nix::sys::stat::mkdirat(tmp, name.as_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) => {}
            Err(nix::errno::Errno::EEXIST) => continue,
            Err(e) => return Err(e.into()),
        }
        if let Some(id) = owner {
            nix::unistd::fchownat(
                tmp,
                name.as_str(),
                Some(id.uid.into()),
                Some(id.gid.into()),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
        }
        return Ok(Path::new("/tmp").join(name));
    }
    Err(std::io::Error::from_raw_os_error(libc::EEXIST))
}
