//! The view's root can be listed (`ls /`, `find /`, a shell's globbing), with or without a
//! policy file: it holds only the grants, so listing it hides nothing. Writing to it stays
//! refused with the errno it had (EROFS: the root is remounted read-only), and a denied path
//! inside a grant still cannot be listed. Through the real binary.

mod support;

use support::{Workdir, py, require, which};

const LIST_ROOT: &str = r#"
import errno, os
names = sorted(os.listdir("/"))
print("root", " ".join(names))
for what, f in [
    ("create", lambda: os.open("/x", os.O_CREAT | os.O_WRONLY, 0o600)),
    ("mkdir", lambda: os.mkdir("/y")),
    ("rename", lambda: os.rename("/tmp", "/tmp2")),
]:
    try:
        f()
        print(what, "ALLOWED")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
"#;

fn check_listing(out: &str) {
    let root = out
        .lines()
        .find_map(|l| l.strip_prefix("root "))
        .unwrap_or_else(|| panic!("no listing: {out}"));
    let names: Vec<&str> = root.split(' ').collect();
    for want in ["dev", "proc", "tmp", "usr"] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    // Only grants: nothing of the host's root that no grant covers.
    for host_only in ["root", "home", "boot", "srv"] {
        assert!(!names.contains(&host_only), "{host_only} in {names:?}");
    }
    for what in ["create", "mkdir", "rename"] {
        assert!(out.contains(&format!("{what} EROFS")), "{what}: {out}");
    }
}

#[test]
fn the_view_root_lists_and_stays_read_only() {
    if !require(which("python3"), "python3") {
        return;
    }
    let wd = Workdir::new();
    let r = py(&wd, &[], LIST_ROOT);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    check_listing(&r.stdout());
    // `ls /` as a user types it.
    let r = support::run(&wd, &[], &["ls", "/"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r.stdout().lines().any(|l| l == "usr"), "{}", r.stdout());
}

#[test]
fn with_a_policy_file_too() {
    if !require(which("python3"), "python3") {
        return;
    }
    let wd = Workdir::new();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(
        &policy,
        "version: 1\nfilesystem_policy:\n  include_workdir: true\n  read_only: [/usr, /lib, /lib64, /bin, /etc]\n  read_write: [/tmp]\n",
    )
    .unwrap();
    let r = py(&wd, &["--policy", policy.to_str().unwrap()], LIST_ROOT);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    check_listing(&r.stdout());
}

/// The listing right reaches below the root, as Landlock's rights do: a denied directory
/// inside a grant is still a cover the sandbox cannot open.
#[test]
fn a_denied_directory_stays_unlistable() {
    if !require(which("python3"), "python3") {
        return;
    }
    let wd = Workdir::new();
    let secret = wd.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("key"), "k").unwrap();
    let code = format!(
        "import errno, os\n\
         print(sorted(os.listdir('.')))\n\
         try:\n    os.listdir({s:?}); print('listed')\n\
         except OSError as e:\n    print('secret', errno.errorcode[e.errno])\n",
        s = secret.to_str().unwrap()
    );
    let r = py(&wd, &["--deny", secret.to_str().unwrap()], &code);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r.stdout().contains("secret EACCES"), "{}", r.stdout());
}

/// The host's mount tree is gone before the command starts: the init detaches the old root
/// (stacked on the view's by the pivot) while the supervisor reads its report, and the
/// command's mount table holds the view's mounts alone: one root, a tmpfs, and none of the
/// host's own mount points.
#[test]
fn the_old_root_is_detached_before_the_command_runs() {
    let wd = Workdir::new();
    let r = support::run(&wd, &[], &["cat", "/proc/self/mountinfo"]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let out = r.stdout();
    // Field 5 is the mount point; the file system type follows the " - " separator.
    let mounts: Vec<(&str, &str)> = out
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            Some((left.split(' ').nth(4)?, right.split(' ').next()?))
        })
        .collect();
    assert!(!mounts.is_empty(), "{out}");
    let roots: Vec<&(&str, &str)> = mounts.iter().filter(|(at, _)| *at == "/").collect();
    assert_eq!(roots.len(), 1, "one root, the view's: {out}");
    assert_eq!(
        roots[0].1, "tmpfs",
        "the view's root is its own tmpfs: {out}"
    );
    for (at, _) in &mounts {
        for host in ["/sys", "/run", "/boot", "/home", "/root", "/var"] {
            assert!(
                !(*at == host || at.starts_with(&format!("{host}/"))),
                "a host mount point {at} in the view: {out}"
            );
        }
    }
}
