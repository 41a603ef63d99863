use super::*;

const MOUNTINFO: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
37 30 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime shared:9 - cgroup cgroup rw,pids
";

#[test]
fn v1_freezer_and_the_supervisors_own_group() {
    let own = "6:freezer:/sup\n8:pids:/sup\n0::/\n";
    let f = Freezer::from_texts(MOUNTINFO, own);
    let h = f.v1.as_ref().unwrap();
    assert_eq!(h.mount, Path::new("/sys/fs/cgroup/freezer"));
    assert_eq!((h.root.as_str(), h.own.as_str()), ("/", "/sup"));
    assert!(f.v2.is_none());
    assert_eq!(
        paths("6:freezer:/a/exec-1\n0::/x\n"),
        (Some("/a/exec-1".into()), Some("/x".into()))
    );
    assert_eq!(unescape("/a\\040b"), "/a b");
}

#[test]
fn v2_only() {
    let mi = "40 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let f = Freezer::from_texts(mi, "0::/sup\n");
    assert!(f.v1.is_none());
    assert_eq!(f.v2.as_ref().unwrap().own, "/sup");
}

/// Whether the test runs as root, which making cgroups needs; a skip says so, and fails
/// under CI=true.
fn root_or_skip() -> bool {
    if crate::sys::process::euid() == 0 {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("root is required to make cgroups (CI=true turns this skip into a failure)");
    }
    eprintln!("SKIPPED: not root, cannot make a cgroup to freeze");
    false
}

/// The real hierarchies: a child in a fresh group of each freezer this machine has (v1,
/// and v2 on its own), frozen, seen frozen, and thawed when the guard drops.
#[test]
fn each_hierarchy_freezes_a_group_and_thaws_it() {
    if !root_or_skip() {
        return;
    }
    let full = Freezer::new();
    let mut tried = Vec::new();
    for v2 in [false, true] {
        let f = Freezer {
            v1: full.v1.clone().filter(|_| !v2),
            v2: full.v2.clone().filter(|_| v2),
            ..Freezer::default()
        };
        let Some(h) = f.v1.as_ref().or(f.v2.as_ref()) else {
            continue;
        };
        let rel = format!("osb-freeze-test-{}-{v2}", std::process::id());
        let dir = h.mount.join(&rel);
        if fs::create_dir(&dir).is_err() {
            continue;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        let g = Group {
            dir: dir.clone(),
            v2,
        };
        let frozen = f.freeze(&[pid], None).expect("the group freezes");
        assert!(frozen.still_frozen() && frozen.covers(&[pid]));
        assert_eq!(g.state(), Some(State::Frozen));
        drop(frozen);
        assert_eq!(g.state(), Some(State::Thawed));
        // A group someone else froze is left frozen.
        g.set(true).unwrap();
        let start = Instant::now();
        while g.state() != Some(State::Frozen) && start.elapsed() < FREEZE_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(f.freeze(&[pid], None).expect("already frozen"));
        assert_eq!(g.state(), Some(State::Frozen));
        // One open descriptor sees each change: a read at offset 0 is made anew.
        let held = Held::open(g.clone()).unwrap();
        assert_eq!(held.state(), Some(State::Frozen));
        held.set(false).unwrap();
        assert_eq!(held.state(), Some(State::Thawed));
        held.set(true).unwrap();
        let start = Instant::now();
        while held.state() != Some(State::Frozen) && start.elapsed() < FREEZE_WAIT {
            std::thread::yield_now();
        }
        assert_eq!(held.state(), Some(State::Frozen));
        g.set(false).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let _ = fs::remove_dir(&dir);
        tried.push(if v2 { "v2" } else { "v1" });
    }
    if tried.is_empty() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("no writable freezer hierarchy (CI=true turns this skip into a failure)");
        }
        eprintln!("SKIPPED: no writable freezer hierarchy");
    }
    eprintln!("froze and thawed: {tried:?}");
}

/// The anchor: made frozen and empty at a freezer's first v1 freeze, a dead supervisor's
/// (its lock free) swept, a live one's left, and removed with the last clone of its
/// freezer.
#[test]
fn the_first_v1_freeze_keeps_an_anchor_frozen_until_the_freezer_goes() {
    if !root_or_skip() {
        return;
    }
    let full = Freezer::new();
    let Some(h) = full.v1.clone() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("no v1 freezer hierarchy (CI=true turns this skip into a failure)");
        }
        eprintln!("SKIPPED: no v1 freezer hierarchy");
        return;
    };
    let parent = h.mount.join(h.own.trim_start_matches('/'));
    let me = std::process::id();
    // A dead supervisor's anchor (nobody holds its lock), and a live one's.
    let dead = parent.join(format!("{ANCHOR_PREFIX}{me}.dead-test"));
    let live = parent.join(format!("{ANCHOR_PREFIX}{me}.live-test"));
    fs::create_dir(&dead).unwrap();
    fs::create_dir(&live).unwrap();
    let live_lock = fs::File::open(&live).unwrap();
    assert!(lock_free(&live_lock));

    let group = parent.join(format!("osb-anchor-test-{me}"));
    fs::create_dir(&group).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    fs::write(group.join("cgroup.procs"), child.id().to_string()).unwrap();
    let f = Freezer {
        v1: Some(h),
        ..Freezer::default()
    };
    drop(f.freeze(&[child.id()], None).expect("the group freezes"));
    let anchor = f
        .anchor
        .get()
        .and_then(|a| a.as_ref())
        .expect("an anchor was made")
        .dir
        .clone();
    let anchor_group = Group {
        dir: anchor.clone(),
        v2: false,
    };
    assert_eq!(anchor_group.state(), Some(State::Frozen));
    assert_eq!(fs::read_to_string(anchor.join("cgroup.procs")).unwrap(), "");
    assert!(!dead.exists(), "a dead supervisor's anchor is swept");
    assert!(live.exists(), "a live supervisor's anchor stays");
    // The scanned group itself was thawed; the anchor stays frozen across scans.
    assert_eq!(
        Group {
            dir: group.clone(),
            v2: false
        }
        .state(),
        Some(State::Thawed)
    );
    let clone = f.clone();
    drop(f);
    assert!(anchor.exists(), "a clone of the freezer still holds it");
    drop(clone);
    assert!(!anchor.exists(), "removed with the last clone");
    let _ = child.kill();
    let _ = child.wait();
    let _ = fs::remove_dir(&group);
    drop(live_lock);
    fs::remove_dir(&live).unwrap();
}

#[test]
fn nothing_to_freeze_without_a_hierarchy() {
    assert_eq!(
        Freezer::none().freeze(&[std::process::id()], None).err(),
        Some(NotFrozen::Unavailable)
    );
}
