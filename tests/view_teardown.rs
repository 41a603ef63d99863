//! `run`'s view is torn down beside the supervisor's end of the run, not in its exec init's
//! exit: the supervisor holds the view's mount namespace by descriptor while the command runs,
//! so the init is not its last holder. Through the real binary.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::{BIN, Reaped, Workdir, require_root};

#[test]
fn the_supervisor_holds_the_views_mount_namespace_while_the_command_runs() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    // Reaped: a failed read or assertion must not leave the run waiting on its stdin.
    let mut child = Reaped(
        Command::new(BIN)
            .args(["run", "-q", "--workdir"])
            .arg(wd.path())
            .args([
                "--",
                "/bin/sh",
                "-c",
                "readlink /proc/self/ns/mnt; read x; exit 0",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ns = line.trim().to_string();
    let held = std::fs::read_dir(format!("/proc/{}/fd", child.id()))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|l| l.to_string_lossy() == ns);
    // EOF on the command's stdin ends its `read` (status 1, hence the `exit 0`), and the run.
    drop(child.stdin.take());
    let st = child.wait().unwrap();
    assert!(ns.starts_with("mnt:["), "the command printed {ns:?}");
    assert!(
        held,
        "the supervisor holds no descriptor of the command's mount namespace {ns}"
    );
    assert_eq!(st.code(), Some(0));
}
