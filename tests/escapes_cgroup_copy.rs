//! The read-only-cgroup copy (src/sandbox/cgroup_remount.rs) from inside an exec: the
//! supervisor holds a detached read-write clone of each read-only cgroup mount as
//! `/proc/self/fd/N`. A sandboxed command must not reach it: not through the init's
//! descriptors (`/proc/1/fd`, the init being a fork of the supervisor), not through a mount of
//! its own view, and its own group's limit files stay unwritable.

mod support;

use std::process::Command;

use support::{BIN, Workdir, cgroup_mounts, require, require_root, which};

const PROBE: &str = r#"
import errno, os
def err(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
path = [l.split(':', 2)[2] for l in open('/proc/self/cgroup').read().splitlines() if l.split(':')[1] == 'pids'][0]
print('pids-group', path)
print('write-own-pids.max', err(lambda: open('/sys/fs/cgroup/pids' + path + '/pids.max', 'w').write('max')))
print('list-init-fds', err(lambda: os.listdir('/proc/1/fd')))
print('open-init-fds', sorted({err(lambda n=n: os.close(os.open('/proc/1/fd/%d' % n, os.O_RDONLY))) for n in range(64)}))
print('readlink-init-fds', sorted({err(lambda n=n: os.readlink('/proc/1/fd/%d' % n)) for n in range(64)}))
rw = [l for l in open('/proc/self/mountinfo').read().splitlines() if ' - cgroup' in l and l.split()[5].split(',')[0] == 'rw']
print('rw-cgroup-mounts', len(rw))
"#;

/// Under read-only remounts of every cgroup mount (the pod's shape), the exec is in a pids
/// group of its own made through the copy, and nothing of the copy is in its reach.
#[test]
fn an_exec_cannot_reach_the_read_write_cgroup_copy() {
    if !require_root() || !require(which("unshare"), "unshare (util-linux)") {
        return;
    }
    let mounts = cgroup_mounts();
    assert!(!mounts.is_empty(), "no cgroup mounts on this machine");
    let mut script = String::new();
    for m in &mounts {
        script.push_str(&format!("mount -o remount,bind,ro '{m}' || exit 97\n"));
    }
    script.push_str("exec \"$@\"\n");
    let wd = Workdir::new();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(&script)
        .arg("sh")
        .arg(BIN)
        .args(["run", "--workdir"])
        .arg(wd.path())
        .args(["--pids", "64", "--", "python3", "-c", PROBE])
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let line = |k: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no `{k}` line:\n{stdout}\n{stderr}"))
            .to_string()
    };
    assert!(line("pids-group").contains("/openshell-owned-"), "{stdout}");
    // /sys/fs/cgroup is not granted, so it does not exist in the view's root at all (without
    // that root it would be the pod's read-only mount: EROFS).
    assert_eq!(line("write-own-pids.max"), "ENOENT", "{stdout}");
    assert_eq!(line("list-init-fds"), "EACCES", "{stdout}");
    assert_eq!(line("open-init-fds"), "['EACCES']", "{stdout}");
    assert_eq!(line("readlink-init-fds"), "['EACCES']", "{stdout}");
    assert_eq!(line("rw-cgroup-mounts"), "0", "{stdout}");
}
