//! The workdir `run` takes when none is named: the current directory, read-write for the
//! command. Some current directories must not be taken that way: a home directory (generated
//! code could rewrite the user's dotfiles, keys and every project), a directory above one,
//! `/`, or the system's own trees. Named with `--workdir`, the same directory is the user's
//! explicit choice and the policy's usual checks decide.

use std::path::{Path, PathBuf};

/// Why `cwd` cannot be the workdir unless it is named with `--workdir`; `None` when it can.
/// `home` is `$HOME`; `owner_home` the home directory of the user who owns `cwd` (so that
/// `sudo openshell-sandbox run` in `/home/alice`, where `$HOME` is root's, is caught too).
pub(super) fn refusal(
    cwd: &Path,
    home: Option<&Path>,
    owner_home: Option<&Path>,
) -> Option<String> {
    // For a home, the directory itself is a workdir one may mean; `/` and the system's trees
    // are refused as one anyway (policy/fs.rs) or hold nothing of a project's.
    let (what, may_mean) = if cwd == Path::new("/") {
        ("the root directory".to_owned(), false)
    } else if let Some(h) = [home, owner_home].into_iter().flatten().find(|h| *h == cwd) {
        (format!("a home directory ({})", h.display()), true)
    } else if let Some(h) = home.filter(|h| h.starts_with(cwd)) {
        (format!("above the home directory {}", h.display()), true)
    } else if system_for_a_workdir(cwd) {
        let trees = "(/usr, /etc, /run, /boot, /var/lib, /opt/PACKAGE, ...)";
        (format!("in the system's own trees {trees}"), false)
    } else {
        return None;
    };
    let cwd = cwd.display();
    Some(format!(
        "the current directory {cwd} is {what}; without --workdir it would be the command's \
         read-write workdir, all of it: cd to a project directory, or name the workdir with \
         --workdir DIR{}",
        if may_mean {
            format!(" (`--workdir {cwd}` if you mean it)")
        } else {
            String::new()
        }
    ))
}

/// In the system's own trees as far as an implicit workdir goes. `/var` and `/opt` hold the
/// system's data and packages at their first level (`/var/lib`, `/var/log`, `/opt/PACKAGE`),
/// but projects deeper down are common (`/var/lib/jenkins/workspace/job`, `/var/www/site`,
/// `/opt/app/src`): those are taken as a workdir like any other directory, and the policy's
/// usual checks still apply to them.
fn system_for_a_workdir(cwd: &Path) -> bool {
    if !crate::sys::walk::in_system_tree(cwd) {
        return false;
    }
    let deep_below = |top: &str| cwd.starts_with(top) && cwd.components().count() > 3;
    !(deep_below("/var") || deep_below("/opt"))
}

/// `$HOME`, made absolute and resolved where it exists.
pub(super) fn home_env() -> Option<PathBuf> {
    let h = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    let h = PathBuf::from(h);
    Some(h.canonicalize().unwrap_or(h))
}

/// The home directory of the user who owns `dir`, from the user database.
pub(super) fn owner_home(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata(dir).ok()?.uid();
    let user = nix::unistd::User::from_uid(uid.into()).ok()??;
    Some(user.dir.canonicalize().unwrap_or(user.dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(cwd: &str, home: Option<&str>, owner: Option<&str>) -> Option<String> {
        refusal(Path::new(cwd), home.map(Path::new), owner.map(Path::new))
    }

    #[test]
    fn homes_and_what_holds_them_are_refused() {
        let h = Some("/home/alice");
        assert!(
            refused("/home/alice", h, None)
                .unwrap()
                .contains("a home directory")
        );
        assert!(
            refused("/home", h, None)
                .unwrap()
                .contains("above the home directory")
        );
        // Under sudo: $HOME is root's, the directory is alice's home.
        let e = refused("/home/alice", Some("/root"), Some("/home/alice")).unwrap();
        assert!(e.contains("/home/alice"), "{e}");
        assert!(e.contains("`--workdir /home/alice` if you mean it"), "{e}");
        // A project below the home is what a workdir is for.
        assert_eq!(refused("/home/alice/project", h, Some("/home/alice")), None);
    }

    #[test]
    fn the_root_and_the_system_trees_are_refused() {
        let e = refused("/", None, None).unwrap();
        assert!(
            e.contains("the root directory") && !e.contains("if you mean it"),
            "{e}"
        );
        for d in [
            "/usr",
            "/usr/local/src",
            "/etc",
            "/opt/tool",
            "/var/lib",
            "/run/x",
            "/boot",
        ] {
            assert!(refused(d, Some("/home/a"), None).is_some(), "{d}");
        }
        for d in ["/var", "/var/log", "/opt"] {
            assert!(refused(d, Some("/home/a"), None).is_some(), "{d}");
        }
        for d in [
            "/srv/app",
            "/data/x",
            "/tmp/w",
            "/var/lib/jenkins/workspace",
            "/var/www/site",
            "/opt/app/src",
        ] {
            assert_eq!(refused(d, Some("/home/a"), None), None, "{d}");
        }
    }
}
