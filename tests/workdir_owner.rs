//! Who owns what a run writes, seen from the host after the run: the workdir and every `--rw`
//! grant are bound into the view as idmapped mounts (the sandbox's uid and gid seen as the
//! directory owner's), so nothing is chowned, concurrent and nested runs share one tree, and
//! what a run wrote belongs to the owner. Where idmapped mounts are refused (a filesystem
//! without them, or `OSB_TEST_DENY_IDMAP=1` in test builds), `run` hands its workdir over on
//! descriptors from the walk, back after the run, under a lock that covers the ancestors and
//! descendants of the tree. And a workdir of /tmp or /dev/shm, where the view has its private
//! tmpfs, is refused with the reason. Every test drives the real binary as root.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use support::*;

/// The default `--uid-range` of `run` (see README).
const RANGE: std::ops::RangeInclusive<u32> = 1_900_000_000..=1_900_000_999;
const NOBODY: u32 = 65534;

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.uid(), m.gid())
}

fn mkdir_owned(p: &Path, uid: u32, mode: u32) {
    std::fs::create_dir_all(p).unwrap();
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write_owned(p: &Path, uid: u32, text: &str) {
    std::fs::write(p, text).unwrap();
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
}

/// Every entry below `root` (and `root`), with its owner.
fn owners_below(root: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = vec![(root.to_path_buf(), owner(root).0)];
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            out.push((e.path(), m.uid()));
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    out
}

fn layer<'a>(report: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    report["layers"]
        .as_array()?
        .iter()
        .find(|l| l["layer"] == name)
}

fn wait_for(p: &Path, secs: u64) -> bool {
    wait_until(secs, || p.exists())
}

/// A directory for the test's workdirs, root-owned 0755, removed on drop. Not in /tmp: a
/// hand-over conflicts with a run that has an ancestor of its tree as a grant, and another
/// test here grants /tmp itself.
struct Tree(tempfile::TempDir);

impl Tree {
    fn new() -> Tree {
        let d = tempfile::Builder::new()
            .prefix("osb-owner-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Tree(d)
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn workdir(&self, rel: &str, uid: u32) -> PathBuf {
        let p = self.path().join(rel);
        mkdir_owned(&p, uid, 0o755);
        p
    }
}

/// `run --workdir W [extra] -- sh -c SCRIPT`, held until `W/release` exists when the script
/// waits for it.
fn spawn_in(wd: &Path, extra: &[&str], env: &[(String, String)], script: &str) -> Child {
    Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(wd)
        .args(extra)
        .args(["--", "sh", "-c", script])
        .envs(env.iter().cloned())
        .current_dir(wd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `run --workdir W [extra] --report-json R -- sh -c SCRIPT` to the end.
fn run_in(wd: &Path, extra: &[&str], env: &[(String, String)], script: &str) -> Run {
    let report = std::env::temp_dir().join(format!(
        "osb-owner-report-{}-{:x}.json",
        std::process::id(),
        rand::random::<u64>()
    ));
    let out = Command::new(BIN)
        .args(["run", "--workdir"])
        .arg(wd)
        .arg("--report-json")
        .arg(&report)
        .args(extra)
        .args(["--", "sh", "-c", script])
        .envs(env.iter().cloned())
        .current_dir(wd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let report_json = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&report);
    Run {
        out,
        report: report_json,
    }
}

fn finish(c: Child) -> (Option<i32>, String, String) {
    let o = c.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Test builds: make the view's idmapped binds fail as on a filesystem without them.
fn deny_idmap() -> Vec<(String, String)> {
    vec![("OSB_TEST_DENY_IDMAP".into(), "1".into())]
}

const WAIT: &str = ": > ready; while [ ! -e release ]; do sleep 0.02; done";

#[test]
fn a_run_writes_as_the_workdirs_owner_and_nothing_is_chowned() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let w = wd.path();
    write_owned(&w.join("root-file"), 0, "r");
    write_owned(&w.join("users"), 4242, "u");
    let r = run_in(
        w,
        &[],
        &[],
        "id -u; stat -c %u . root-file users; mkdir d && echo x > d/f && ln -s /etc d/l && echo ok",
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let lines: Vec<String> = r.stdout().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 5, "{}", r.stdout());
    let uid: u32 = lines[0].parse().unwrap();
    assert!(RANGE.contains(&uid), "{uid}");
    // Inside, the workdir is the run's own; the files of others keep their owners.
    assert_eq!(lines[1], uid.to_string(), "the workdir as the run sees it");
    assert_eq!(lines[2], "0", "root's file as the run sees it");
    assert_eq!(lines[3], "4242", "another user's file as the run sees it");
    // On the host, everything belongs to the workdir's owner; nothing was re-owned.
    for p in ["", "d", "d/f", "d/l"] {
        assert_eq!(owner(&w.join(p)), (NOBODY, NOBODY), "{p:?}");
    }
    assert_eq!(owner(&w.join("root-file")).0, 0);
    assert_eq!(owner(&w.join("users")).0, 4242);
    let row = layer(&r.report, "ownership").unwrap_or_else(|| panic!("{}", r.report));
    assert_eq!(row["status"], "enforced", "{row}");
    let detail = row["detail"].as_str().unwrap();
    assert!(
        detail.contains("idmapped") && detail.contains("65534"),
        "{detail}"
    );
}

/// The mapping changes whose files the sandbox owns, not what it may reach: a denied file
/// inside the idmapped workdir, the sandbox's own by owner there, stays unreadable and
/// unwritable.
#[test]
fn a_denied_path_inside_an_idmapped_workdir_stays_denied() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let secret = wd.path().join("secret");
    write_owned(&secret, NOBODY, "s3cret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = run_in(
        wd.path(),
        &["--deny", secret.to_str().unwrap()],
        &[],
        "cat secret; echo x >> secret; echo ok > other && cat other",
    );
    assert!(!r.stdout().contains("s3cret"), "{}", r.stdout());
    assert_eq!(r.stdout(), "ok\n", "{}", r.stderr());
    assert_eq!(
        r.stderr().matches("Permission denied").count(),
        2,
        "{}",
        r.stderr()
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "s3cret");
    assert_eq!(owner(&wd.path().join("other")).0, NOBODY);
}

/// Runs in one tree at once, as with bwrap: a run in the parent of a live run's workdir, a
/// second per-run-uid run in the same workdir and an explicit `--uid 65534` run there all
/// succeed, and the first run keeps writing after them.
#[test]
fn concurrent_and_nested_runs_in_one_tree_all_succeed() {
    if !require_root() {
        return;
    }
    let t = Tree::new();
    let outer = t.workdir("w", NOBODY);
    let inner = t.workdir("w/inner", NOBODY);
    let a = spawn_in(
        &inner,
        &[],
        &[],
        &format!("echo one > a; {WAIT}; echo two >> a && cat a"),
    );
    assert!(wait_for(&inner.join("ready"), 60), "run A never started");
    let b = run_in(&outer, &[], &[], "echo b > b && echo b > inner/from-outer");
    let c = run_in(&inner, &[], &[], "echo c > c");
    let d = run_in(&inner, &["--uid", "65534"], &[], "echo d > d && id -u");
    write_owned(&inner.join("release"), NOBODY, "");
    let (code, out, err) = finish(a);
    assert_eq!(b.code(), 0, "the run in the parent: {}", b.stderr());
    assert_eq!(c.code(), 0, "the second run in the workdir: {}", c.stderr());
    assert_eq!(d.code(), 0, "the --uid 65534 run: {}", d.stderr());
    assert_eq!(d.stdout().trim(), "65534");
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "one\ntwo\n"),
        "run A: {err}"
    );
    for (p, uid) in owners_below(&outer) {
        assert_eq!(uid, NOBODY, "{} belongs to {uid}", p.display());
    }
}

/// A directory chain deeper than any walk bound, left in the workdir, made every later run
/// there fail before it started.
#[test]
fn a_deep_tree_in_the_workdir_does_not_stop_a_run() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let mut p = wd.path().to_path_buf();
    for _ in 0..300 {
        p.push("d");
        mkdir_owned(&p, NOBODY, 0o755);
    }
    let r = run_in(wd.path(), &[], &[], "echo ok > ok");
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(owner(&wd.path().join("ok")).0, NOBODY);
    assert_eq!(owner(&p).0, NOBODY);
}

/// A run refused because the workdir is not writable changes no owner (a 0555 workdir of 65534
/// was left to a dead per-run uid).
#[test]
fn a_refused_run_changes_no_owner() {
    if !require_root() {
        return;
    }
    // With idmapped mounts, and (test builds) where they are refused and the workdir would be
    // handed over.
    let mut envs = vec![vec![]];
    if cfg!(feature = "test-pause-points") {
        envs.push(deny_idmap());
    }
    for env in envs {
        let wd = Workdir::new();
        std::fs::set_permissions(wd.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
        let r = run_in(wd.path(), &[], &env, "echo x > x");
        assert_eq!(r.code(), 125, "{env:?}: {}", r.stderr());
        assert!(r.stderr().contains("not writable"), "{}", r.stderr());
        assert_eq!(owner(wd.path()), (NOBODY, NOBODY), "{env:?}");
        assert!(!wd.path().join("x").exists());
    }
}

/// The first root run in a fresh root-owned directory (`mkdir x && cd x && sudo run ...`) was
/// refused; it runs, and what it wrote belongs to root, the directory's owner.
#[test]
fn the_first_run_in_a_fresh_root_owned_directory_runs() {
    if !require_root() {
        return;
    }
    let t = Tree::new();
    let w = t.workdir("fresh", 0);
    let r = run_in(&w, &[], &[], "echo x > f && mkdir d && id -u");
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let uid: u32 = r.stdout().trim().parse().unwrap();
    assert!(RANGE.contains(&uid), "{uid}");
    assert_eq!(owner(&w.join("f")), (0, 0));
    assert_eq!(owner(&w.join("d")), (0, 0));
    assert_eq!(owner(&w), (0, 0));
}

/// A run in a root-owned workdir writes as root there, so its links are root-owned on disk:
/// a later run must not trust one as root's own, neither as a grant nor on the way to its
/// report (before the grant walk counted root's owner write for every uid, run 2 wrote
/// root-owned files in the directory the link pointed to, and the report went there).
#[test]
fn a_link_planted_by_a_run_in_a_root_owned_workdir_is_never_followed() {
    if !require_root() {
        return;
    }
    let t = Tree::new();
    let trusted_chain = t.path().ancestors().all(|d| {
        let m = std::fs::metadata(d).unwrap();
        m.uid() == 0 && m.mode() & 0o022 == 0
    });
    if !require(
        trusted_chain,
        "CARGO_TARGET_TMPDIR below root-owned directories without group or other write",
    ) {
        return;
    }
    let w = t.workdir("w", 0);
    let victim = t.workdir("victim", 0);
    let r1 = run_in(
        &w,
        &[],
        &[],
        &format!(
            "ln -s {} project && ln -s {} out",
            victim.display(),
            victim.display()
        ),
    );
    assert_eq!(r1.code(), 0, "run 1: {}", r1.stderr());
    assert_eq!(owner(&w.join("project")).0, 0, "the link is root's on disk");
    let link = w.join("project");
    let r2 = run_in(&link, &[], &[], "echo x > pwned");
    assert!(
        !victim.join("pwned").exists(),
        "run 2 wrote through the link"
    );
    assert_eq!(r2.code(), 125, "{}", r2.stderr());
    assert!(
        r2.stderr().contains(&format!("symlink {}", link.display())),
        "{}",
        r2.stderr()
    );
    let report = w.join("out/report.json");
    let r3 = Command::new(BIN)
        .args(["run", "-q", "--workdir"])
        .arg(t.workdir("other", NOBODY))
        .arg("--report-json")
        .arg(&report)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(
        !victim.join("report.json").exists(),
        "the report went through the link"
    );
    assert_ne!(r3.status.code(), Some(0));
}

/// Each `--rw` grant is written as its own owner, a grant nested in the workdir too; a
/// `--ro` grant inside the workdir shows the owners the workdir shows.
#[test]
fn each_read_write_grant_is_written_as_its_own_owner() {
    if !require_root() {
        return;
    }
    let t = Tree::new();
    let w = t.workdir("w", NOBODY);
    let sub = t.workdir("w/sub", 4242);
    let ro = t.workdir("w/ro", NOBODY);
    let other = t.workdir("other", 4243);
    let script = "echo s > sub/s && echo o > \"$OTHER/o\" && stat -c %u ro . sub \"$OTHER\"";
    let r = run_in(
        &w,
        &[
            "--rw",
            sub.to_str().unwrap(),
            "--rw",
            other.to_str().unwrap(),
            "--ro",
            ro.to_str().unwrap(),
            "--env",
            &format!("OTHER={}", other.display()),
        ],
        &[],
        script,
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let stdout = r.stdout();
    let seen: Vec<&str> = stdout.lines().collect();
    let uid = r.report["uid"].as_u64().unwrap().to_string();
    assert_eq!(seen, vec![uid.as_str(); 4], "{}", r.stdout());
    assert_eq!(owner(&sub.join("s")), (4242, 4242));
    assert_eq!(owner(&other.join("o")), (4243, 4243));
    let w2 = run_in(&w, &["--ro", ro.to_str().unwrap()], &[], "echo x > ro/x");
    assert_ne!(w2.code(), 0, "a read-only grant was written");
    assert!(
        w2.stderr().contains("Read-only file system"),
        "{}",
        w2.stderr()
    );
}

/// A grant of /tmp or /dev/shm itself is the host's directory, as documented (the report says
/// so): writable, and what is written there is on the host.
#[test]
fn a_grant_of_tmp_itself_is_the_hosts_tmp() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let name = format!(
        "osb-rw-tmp-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    );
    for dir in ["/tmp", "/dev/shm"] {
        let target = Path::new(dir).join(&name);
        let r = run_in(
            wd.path(),
            &["--rw", dir],
            &[],
            &format!("echo x > {} && echo w > here", target.display()),
        );
        let found = std::fs::read_to_string(&target).ok();
        let _ = std::fs::remove_file(&target);
        assert_eq!(r.code(), 0, "--rw {dir}: {}", r.stderr());
        assert_eq!(found.as_deref(), Some("x\n"), "--rw {dir}");
        // The workdir inside /tmp is still written as its owner.
        assert_eq!(owner(&wd.path().join("here")).0, NOBODY, "--rw {dir}");
        let mount = layer(&r.report, "namespace-mount").unwrap();
        assert!(
            mount["detail"]
                .as_str()
                .unwrap()
                .contains(&format!("{dir} is itself granted and stays as it is")),
            "{mount}"
        );
    }
}

// ---- where idmapped mounts are refused: the hand-over ----

fn require_knob() -> bool {
    require_root() && require_pause_points()
}

/// Without idmapped mounts the workdir is handed to the run's uid for the run and back to its
/// owner after it; the report's row says so.
#[test]
fn without_idmapped_mounts_the_workdir_is_handed_over_and_back() {
    if !require_knob() {
        return;
    }
    let t = Tree::new();
    let wd = t.workdir("wd", NOBODY);
    let r = run_in(
        &wd,
        &[],
        &deny_idmap(),
        "id -u; stat -c %u .; mkdir d && echo x > d/f",
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let stdout = r.stdout();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(
        lines[0], lines[1],
        "the workdir was not the run's during the run"
    );
    for (p, uid) in owners_below(&wd) {
        assert_eq!(uid, NOBODY, "{} was not handed back", p.display());
    }
    let row = layer(&r.report, "ownership").unwrap_or_else(|| panic!("{}", r.report));
    let detail = row["detail"].as_str().unwrap();
    assert!(
        detail.contains("refused") && detail.contains("handed"),
        "{detail}"
    );
}

/// A 300-deep chain in a workdir that must be handed over: the run is refused with the reason,
/// and no entry was re-owned.
#[test]
fn without_idmapped_mounts_a_too_deep_workdir_is_refused_and_left_alone() {
    if !require_knob() {
        return;
    }
    let t = Tree::new();
    let wd = t.workdir("wd", NOBODY);
    let mut p = wd.clone();
    for _ in 0..300 {
        p.push("d");
        mkdir_owned(&p, NOBODY, 0o755);
    }
    write_owned(&p.join("f"), NOBODY, "x");
    let r = run_in(&wd, &[], &deny_idmap(), "echo ran > ran");
    assert_ne!(r.code(), 0, "{}", r.stderr());
    assert!(r.stderr().contains("deeper than"), "{}", r.stderr());
    assert!(!wd.join("ran").exists());
    for (p, uid) in owners_below(&wd) {
        assert_eq!(uid, NOBODY, "{} was re-owned", p.display());
    }
}

/// The hand-over walks descriptors: a middle directory of the workdir's path swapped for a
/// symlink after the policy walk and before the hand-over (the supervisor is held there) must
/// not make root re-own the tree the link points to.
#[test]
fn the_hand_over_never_follows_a_middle_directory_swapped_for_a_link() {
    if !require_knob() {
        return;
    }
    let t = Tree::new();
    let wd = t.workdir("a/mid/wd", NOBODY);
    // What the link will point to: a tree outside every workdir, of the sandbox's uid.
    let victim = t.workdir("victim/wd", NOBODY);
    write_owned(&victim.join("f"), NOBODY, "v");
    let pause = PauseDir::new();
    let point = "workdir-handover";
    let mut env = deny_idmap();
    env.extend(pause.env(point));
    let c = spawn_in(&wd, &[], &env, "echo ran > ran");
    assert!(pause.wait_reached(point, 60), "never reached {point}");
    let mid = t.path().join("a/mid");
    std::fs::rename(&mid, t.path().join("a/mid.old")).unwrap();
    std::os::unix::fs::symlink(t.path().join("victim"), &mid).unwrap();
    pause.release(point);
    let (code, _, err) = finish(c);
    for (p, uid) in owners_below(&victim) {
        assert_eq!(
            uid,
            NOBODY,
            "{} outside the workdir was re-owned",
            p.display()
        );
    }
    assert_ne!(code, Some(0), "the run went on: {err}");
    assert!(err.contains("changed since the policy walk"), "{err}");
}

/// The lock of a run that hands its workdir over covers the tree's ancestors and
/// descendants: a run in the parent, or below, is refused while it runs; a run beside it is
/// not.
#[test]
fn a_hand_over_locks_out_runs_above_and_below_but_not_beside() {
    if !require_knob() {
        return;
    }
    let t = Tree::new();
    let outer = t.workdir("w", NOBODY);
    let inner = t.workdir("w/inner", NOBODY);
    let below = t.workdir("w/inner/below", NOBODY);
    let beside = t.workdir("w/beside", NOBODY);
    let a = spawn_in(
        &inner,
        &[],
        &deny_idmap(),
        &format!("echo one > a; {WAIT}; echo two >> a && cat a"),
    );
    assert!(wait_for(&inner.join("ready"), 60), "run A never started");
    let up = run_in(&outer, &[], &deny_idmap(), "echo x > up");
    let down = run_in(&below, &[], &[], "echo x > down");
    let same = run_in(&inner, &["--uid", "65534"], &[], "echo x > same");
    let side = run_in(&beside, &[], &deny_idmap(), "echo x > side");
    write_owned(&inner.join("release"), NOBODY, "");
    let (code, out, err) = finish(a);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "one\ntwo\n"),
        "run A: {err}"
    );
    assert_ne!(up.code(), 0, "the run above ran beside a hand-over");
    assert!(
        up.stderr().contains("cannot be handed over")
            && up.stderr().contains("uses it or a directory below it"),
        "above: {}",
        up.stderr()
    );
    for (name, r) in [("below", &down), ("same", &same)] {
        assert_ne!(r.code(), 0, "the run {name} ran beside a hand-over");
        assert!(
            r.stderr().contains("is in use by a run that hands"),
            "{name}: {}",
            r.stderr()
        );
    }
    assert!(!outer.join("up").exists() && !below.join("down").exists());
    assert_eq!(side.code(), 0, "the run beside: {}", side.stderr());
    for (p, uid) in owners_below(&outer) {
        assert_eq!(uid, NOBODY, "{} was left re-owned", p.display());
    }
}

/// `serve` claims its workdir too (it took no lock at all): a run in the tree above it that
/// must hand its workdir over is refused while serve runs, and serve's main process keeps
/// writing as the sandbox user.
#[test]
fn a_hand_over_is_refused_above_a_running_serve() {
    if !require_knob() {
        return;
    }
    let t = Tree::new();
    let outer = t.workdir("w", NOBODY);
    let served = t.workdir("w/served", NOBODY);
    let main = Command::new(BIN)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["--no-gateway", "--workdir"])
        .arg(&served)
        .args(["sh", "-c", &format!("echo one > a; {WAIT}; echo two >> a")])
        .current_dir(&served)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(&served.join("ready"), 60),
        "serve's main process never started"
    );
    let up = run_in(&outer, &[], &deny_idmap(), "echo x > up");
    write_owned(&served.join("release"), NOBODY, "");
    let (code, _, err) = finish(main);
    assert_eq!(code, Some(0), "serve: {err}");
    assert_eq!(
        std::fs::read_to_string(served.join("a")).unwrap(),
        "one\ntwo\n"
    );
    assert_ne!(up.code(), 0, "the run above serve ran");
    assert!(
        up.stderr().contains("uses it or a directory below it"),
        "{}",
        up.stderr()
    );
    for (p, uid) in owners_below(&outer) {
        assert_eq!(uid, NOBODY, "{} was re-owned", p.display());
    }
}

/// A filesystem that has no idmapped mounts (ramfs): the run still works, by the hand-over,
/// and the report's row names the refusal.
#[test]
fn a_filesystem_without_idmapped_mounts_falls_back_to_the_hand_over() {
    if !require_root() {
        return;
    }
    let t = Tree::new();
    let mnt = t.path().join("ramfs");
    std::fs::create_dir(&mnt).unwrap();
    let c = std::ffi::CString::new(mnt.to_str().unwrap()).unwrap();
    // SAFETY: mount with NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            c"none".as_ptr(),
            c.as_ptr(),
            c"ramfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if !require(rc == 0, "mounting a ramfs") {
        return;
    }
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: umount2 with a NUL-terminated path.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _u = Unmount(c);
    let wd = mnt.join("wd");
    mkdir_owned(&wd, NOBODY, 0o755);
    let r = run_in(&wd, &[], &[], "echo x > f && stat -c %u .");
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout().trim(), r.report["uid"].to_string());
    assert_eq!(owner(&wd.join("f")).0, NOBODY);
    assert_eq!(owner(&wd).0, NOBODY);
    let row = layer(&r.report, "ownership").unwrap_or_else(|| panic!("{}", r.report));
    let detail = row["detail"].as_str().unwrap();
    assert!(
        detail.contains("Invalid argument") && detail.contains("handed"),
        "{detail}"
    );
}

// ---- serve ----

/// `serve` with the workdir as OpenShell sets it up (the sandbox user's): what the execs see
/// of owners, what they write, a download over sftp and what another container of the pod
/// reads from the volume are the same as without a view. Nothing is mapped or re-owned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_shows_the_workdir_as_openshell_sets_it_up() {
    use support::ssh_bridge::{SshBridge, have_openssh};
    use support::{AuthMode, SupOpts, up};
    if !require_root() || !require(have_openssh(), "OpenSSH client (sftp) and busybox") {
        return;
    }
    // The pod's image: the workdir belongs to the sandbox user, with files of root and of
    // another user in it, set up before the supervisor starts.
    let setup = "w=; p=; for a; do [ \"$p\" = --workdir ] && w=$a; p=$a; done; \
                 chown 65534:65534 \"$w\" && chmod 755 \"$w\" && \
                 echo r > \"$w/root-file\" && echo u > \"$w/user-file\" && chown 4242:4243 \"$w/user-file\" && \
                 exec \"$0\" \"$@\"";
    let (gw, sup) = up(
        AuthMode::Jwt,
        SupOpts {
            wrapper: vec!["sh".into(), "-c".into(), setup.into()],
            ..Default::default()
        },
    )
    .await;
    let w = sup.workdir.clone();
    let r = gw
        .exec(&[
            "sh",
            "-c",
            "stat -c '%n %u %g' . root-file user-file && echo made > made && stat -c '%n %u %g' made",
        ])
        .await;
    assert_eq!(r.exit, Some(0), "{r:?}\n{}", sup.log());
    assert_eq!(
        r.out(),
        ". 65534 65534\nroot-file 0 0\nuser-file 4242 4243\nmade 65534 65534\n",
        "{}",
        sup.log()
    );
    // Another container of the pod reads the volume: the same owners.
    assert_eq!(owner(&w), (NOBODY, NOBODY));
    assert_eq!(owner(&w.join("root-file")), (0, 0));
    assert_eq!(owner(&w.join("user-file")), (4242, 4243));
    assert_eq!(owner(&w.join("made")), (NOBODY, NOBODY));
    assert_eq!(std::fs::read_to_string(w.join("made")).unwrap(), "made\n");
    // `download` (the CLI's sftp get).
    let bridge = SshBridge::start(gw.state.clone()).await;
    let local = tempfile::tempdir().unwrap();
    let back = local.path().join("made");
    let batch_dir = tempfile::tempdir().unwrap();
    let batch = batch_dir.path().join("batch");
    std::fs::write(&batch, format!("get made {}\n", back.display())).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        bridge
            .command("sftp")
            .arg("-b")
            .arg(&batch)
            .arg("sandbox")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        sup.log()
    );
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "made\n");
}
