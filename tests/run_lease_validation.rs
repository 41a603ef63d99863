//! A run as root with no uid named runs as a uid of its own (a lease), and its policy is
//! validated as that uid from the start, through the real binary: a link that only `nobody`'s
//! group could have planted is followed for the leased uid, and still refused when the run is
//! `nobody` (`--uid 65534`). Before, the policy was validated as `nobody` first, and such a run
//! was refused in the name of a uid it would never run as.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{BIN, require_root, text};

/// A directory under /run (a system tree: root's links there are trusted as such), mode 0775
/// and group `nobody`'s, holding `share -> /usr/share`; removed on drop.
struct GroupWritable(PathBuf);

impl GroupWritable {
    fn new() -> GroupWritable {
        use std::os::unix::fs::PermissionsExt;
        let d = PathBuf::from(format!("/run/osb-test-lease-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(0), Some(65534)).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o775)).unwrap();
        std::os::unix::fs::symlink("/usr/share", d.join("share")).unwrap();
        GroupWritable(d)
    }
}

impl Drop for GroupWritable {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(uid_range: &str, extra: &[&str], link: &Path) -> std::process::Output {
    let wd = support::Workdir::new();
    Command::new(BIN)
        .args(["run", "-q", "--uid-range", uid_range, "--workdir"])
        .arg(wd.path())
        .args(extra)
        .arg("--ro")
        .arg(link)
        .args(["--", "/bin/sh", "-c", "test -d \"$0\"/doc && id -u"])
        .arg(link)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_leased_run_validates_its_policy_as_its_own_uid() {
    if !require_root() {
        return;
    }
    let dir = GroupWritable::new();
    let link = dir.0.join("share");
    // A uid range of one uid for this test alone.
    let uid = 1_960_000_000 + std::process::id() % 100_000;
    let range = format!("{uid}-{uid}");

    let leased = run(&range, &[], &link);
    assert!(
        leased.status.success(),
        "leased run refused: {}",
        text(&leased.stderr)
    );
    assert_eq!(text(&leased.stdout).trim(), uid.to_string());

    // As `nobody`, whose group may write the directory, the link is still refused, by name.
    let nobody = run(&range, &["--uid", "65534"], &link);
    assert_eq!(nobody.status.code(), Some(125), "{}", text(&nobody.stderr));
    let e = text(&nobody.stderr);
    assert!(
        e.contains("refusing to follow the symlink") && e.contains("gid 65534"),
        "{e}"
    );
}
