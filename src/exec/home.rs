//! The HOME of a `run`'s command: a directory of its own, gone with the run, so that dotfiles
//! and caches (`.python_history`, `.cache`) land neither in the workdir nor anywhere lasting.
//! `/tmp/home`, an empty directory of the sandbox identity made on the view's private /tmp,
//! else the `--scratch` directory; only a degraded run with neither keeps the workdir.

use std::ffi::OsString;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use crate::policy::{Identity, Policy};

/// What a run asks for its command's HOME (none when `--env HOME=...` or `--inherit-env
/// HOME` chose another).
#[derive(Clone, Debug)]
pub struct HomeRequest {
    /// Whom the directory is given to (the sandbox identity; `None`: ours).
    pub owner: Option<Identity>,
    /// The HOME where the view has no private /tmp.
    pub scratch: Option<PathBuf>,
}

/// The name the HOME gets in the view's /tmp: `home`, else `home.N` where a grant of `policy`
/// is bound at (or below) that name, which the view makes before any HOME can be.
pub(super) fn name_in_view(policy: &Policy) -> String {
    let fs = &policy.fs;
    let grants: Vec<PathBuf> = std::iter::once(&fs.workdir)
        .chain(&fs.read_write)
        .chain(&fs.read_only)
        .chain(&fs.devices)
        .chain(&fs.system)
        .flat_map(|p| [Some(p.clone()), crate::sys::walk::canonical(p).ok()])
        .flatten()
        .collect();
    name_clear_of(&grants)
}

/// The first of `home`, `home.1`, … that no path of `grants` lies at or below, in /tmp.
fn name_clear_of(grants: &[PathBuf]) -> String {
    (0..)
        .map(|i| match i {
            0 => "home".to_owned(),
            i => format!("home.{i}"),
        })
        .find(|name| {
            let at = Path::new("/tmp").join(name);
            !grants.iter().any(|g| g.starts_with(&at))
        })
        .expect("some name is free of the grants")
}

/// Set `HOME` in `env` to `home`.
pub(super) fn set(env: &mut Vec<(OsString, OsString)>, home: PathBuf) {
    env.retain(|(k, _)| k != "HOME");
    env.push(("HOME".into(), home.into_os_string()));
}

/// `/tmp/<name>` on the view's /tmp (`tmp`), mode 0700, given to `owner`. No exec has run in
/// the view yet, so nothing of the run's can be in the way, and the calls never follow a link.
pub(super) fn make_named(
    tmp: BorrowedFd<'_>,
    name: &str,
    owner: Option<Identity>,
) -> std::io::Result<PathBuf> {
    use nix::fcntl::AtFlags;
    use nix::sys::stat::Mode;
    nix::sys::stat::mkdirat(tmp, name, Mode::from_bits_truncate(0o700))?;
    if let Some(id) = owner {
        nix::unistd::fchownat(
            tmp,
            name,
            Some(id.uid.into()),
            Some(id.gid.into()),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
    }
    Ok(Path::new("/tmp").join(name))
}

/// [`make_named`] under the first free name (`home`, `home.1`, …), for a view made ahead.
pub(super) fn make_first_free(
    tmp: BorrowedFd<'_>,
    owner: Option<Identity>,
) -> std::io::Result<PathBuf> {
    for i in 0..16 {
        let name = match i {
            0 => "home".to_owned(),
            i => format!("home.{i}"),
        };
        match make_named(tmp, &name, owner) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            r => return r,
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EEXIST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_named_clear_of_the_grants_bound_in_tmp() {
        let g = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(name_clear_of(&g(&["/tmp/work", "/usr"])), "home");
        // `/tmp/homework` is not below `/tmp/home`.
        assert_eq!(name_clear_of(&g(&["/tmp/homework"])), "home");
        assert_eq!(name_clear_of(&g(&["/tmp/home"])), "home.1");
        assert_eq!(
            name_clear_of(&g(&["/tmp/home/project", "/tmp/home.1"])),
            "home.2"
        );
    }
}
