//! Resource bombs and processes that try to outlive their run, with the supervisor as root
//! (child: a test uid; per-exec pids and memory cgroups), with the supervisor non-root (no
//! cgroup: rlimits, the process group and the subreaper sweep only), and with `--uid 0`.
//!
//! Each test asserts what the bomb ran into (the exact errno or signal), that the supervisor
//! ended the run by itself with its report, and that nothing of the test uid is alive
//! afterwards. The bombs run one at a time: on a two-core machine, two spinning fork bombs
//! would mostly measure each other.
//!
//! Run: `cargo test --test escapes_bombs` as root.

mod support;

use std::sync::Mutex;

use support::probe::outside;
use support::probe::{Mode, Outcome, Scene};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const MIB: i64 = 1 << 20;

/// What one bomb run left: the probe's results, the processes of the uid found alive after
/// it (all killed before returning, whatever the result), and the sizes of the `fill*` files
/// in the workdir.
struct BombRun {
    out: Outcome,
    left: Vec<String>,
    fill_sizes: Vec<u64>,
}

fn bomb(uid: u32, mode: Mode, name: &str, flags: &[&str], extra: &[&str]) -> Option<BombRun> {
    if !support::probe::require_root_and_cc() {
        return None;
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let scene = Scene::new(uid);
    let marker = format!("osb-b{uid}");
    let mut args = vec![name.to_string(), format!("marker={marker}")];
    args.extend(scene.params());
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = support::probe::launch(&scene, mode, flags, &args);
    let left = if uid == 0 {
        let left = outside::named(&marker);
        outside::kill_named(&marker);
        left
    } else {
        let left = outside::survivors(uid);
        outside::kill_uid(&scene, uid);
        left
    };
    out.save(&format!("bomb-{name}-{mode:?}"));
    let mut fill_sizes: Vec<u64> = std::fs::read_dir(&scene.wd)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fill"))
        .map(|e| e.metadata().unwrap().len())
        .collect();
    fill_sizes.sort();
    Some(BombRun {
        out,
        left,
        fill_sizes,
    })
}

/// The run ended by itself, the supervisor exited normally with its report, and nothing of
/// the exec is left.
fn assert_clean_end(run: &BombRun, what: &str) {
    let (out, left) = (&run.out, &run.left);
    assert!(
        !out.hung,
        "{what}: `run` did not return within {:?}; the supervisor had to be killed.\nstdout:\n{}\nstderr:\n{}",
        support::probe::HANG,
        out.stdout,
        out.stderr
    );
    assert!(
        left.is_empty(),
        "{what}: {} process(es) outlived the run, e.g. {:?}\nstdout:\n{}\nstderr:\n{}",
        left.len(),
        &left[..left.len().min(5)],
        out.stdout,
        out.stderr
    );
    assert!(
        out.status.success() && out.report.is_some(),
        "{what}: supervisor ended with {:?}, report {:?}\nstderr:\n{}",
        out.status,
        out.report.is_some(),
        out.stderr
    );
}

fn forkbomb(uid: u32, mode: Mode) {
    let Some(run) = bomb(uid, mode, "forkbomb", &["--pids", "64"], &["limit=64"]) else {
        return;
    };
    assert_clean_end(&run, "fork bomb");
    let a = run.out.attempt("forkbomb");
    assert_eq!(
        (a.outcome.as_str(), a.errno),
        ("contained", Some(libc::EAGAIN)),
        "{a:?}"
    );
    assert!(
        a.num("alive") <= 64,
        "more bomb processes than --pids: {a:?}"
    );
}

fn membomb(uid: u32, mode: Mode) {
    let Some(run) = bomb(
        uid,
        mode,
        "membomb",
        // RLIMIT_AS (--address-space) is what answers ENOMEM; --memory is the cgroup's limit.
        &["--memory", "128MiB", "--address-space", "128MiB"],
        &["limit=134217728"],
    ) else {
        return;
    };
    assert_clean_end(&run, "memory bomb");
    let a = run.out.attempt("membomb");
    assert_eq!(
        (a.outcome.as_str(), a.errno),
        ("contained", Some(libc::ENOMEM)),
        "{a:?}"
    );
    assert!(a.num("touched_mib") < 128, "{a:?}");
}

/// Four processes of 80 MiB each under `--memory 128MiB`: only a memory cgroup bounds the sum
/// (`--memory` sets no RLIMIT_AS; that is `--address-space`).
fn membomb_multi(uid: u32, mode: Mode) -> Option<Outcome> {
    let run = bomb(
        uid,
        mode,
        "membomb_multi",
        &["--memory", "128MiB"],
        &["limit=134217728", "procs=4", "each_mib=80"],
    )?;
    assert_clean_end(&run, "memory bomb across processes");
    Some(run.out)
}

/// The supervisor sets SIGXFSZ to "ignore" under --file-size, so the write past the limit
/// fails with EFBIG (the writer is not killed), and the file stops exactly there.
fn diskfill(uid: u32, mode: Mode) {
    let Some(run) = bomb(
        uid,
        mode,
        "diskfill",
        &["--file-size", "1MiB"],
        &["limit=1048576"],
    ) else {
        return;
    };
    assert_clean_end(&run, "disk fill");
    let a = run.out.attempt("diskfill");
    assert_eq!(
        (a.outcome.as_str(), a.errno, a.signal),
        ("contained", Some(libc::EFBIG), None),
        "{a:?}"
    );
    assert_eq!(
        run.fill_sizes,
        vec![MIB as u64],
        "the file must stop at --file-size"
    );
}

/// RLIMIT_FSIZE is per file: four files each stop at the limit with EFBIG (SIGXFSZ ignored),
/// and together hold four times it. The per-file bound is the guarantee; the sum is not.
fn diskfill_many(uid: u32, mode: Mode) {
    let Some(run) = bomb(
        uid,
        mode,
        "diskfill_many",
        &["--file-size", "1MiB"],
        &["limit=1048576", "files=4"],
    ) else {
        return;
    };
    assert_clean_end(&run, "disk fill across files");
    let a = run.out.attempt("diskfill_many");
    assert_eq!(
        (a.outcome.as_str(), a.errno),
        ("contained", Some(libc::EFBIG)),
        "{a:?}"
    );
    assert_eq!(
        run.fill_sizes,
        vec![MIB as u64; 4],
        "every file stops at --file-size"
    );
    assert_eq!(
        a.num("total"),
        4 * MIB,
        "RLIMIT_FSIZE does not bound the total"
    );
}

fn daemon(uid: u32, mode: Mode, name: &str) {
    let Some(run) = bomb(uid, mode, name, &[], &[]) else {
        return;
    };
    let a = run.out.attempt(name);
    assert_eq!(a.outcome, "pending", "the daemon did not start: {a:?}");
    assert!(a.num("pid") > 1, "{a:?}");
    assert_clean_end(&run, name);
}

// Supervisor root: the child is the test uid, in a per-exec cgroup.

#[test]
fn root_fork_bomb_is_contained() {
    forkbomb(64220, Mode::Root);
}

#[test]
fn root_memory_bomb_is_contained() {
    membomb(64221, Mode::Root);
}

#[test]
fn root_memory_bomb_across_processes_is_bounded_by_the_cgroup() {
    let Some(out) = membomb_multi(64222, Mode::Root) else {
        return;
    };
    let a = out.attempt("membomb_multi");
    assert_eq!(a.outcome, "contained", "{a:?}");
    assert!(a.num("total_mib") <= 128, "{a:?}");
    assert_eq!(out.layer("cgroup"), "enforced");
}

#[test]
fn root_disk_fill_stops_at_file_size() {
    diskfill(64223, Mode::Root);
}

#[test]
fn root_disk_fill_limit_is_per_file() {
    diskfill_many(64224, Mode::Root);
}

#[test]
fn root_setsid_daemon_does_not_outlive_the_run() {
    daemon(64225, Mode::Root, "daemon_setsid");
}

/// A daemon that forks and exits in a loop has a new pid at every moment. The cgroup sweep
/// still gets it. (Without a cgroup it escapes some of the time, depending on load; that is
/// timing, so it is not a test: see SECURITY.md.)
#[test]
fn root_fleeing_daemon_does_not_outlive_the_run() {
    daemon(64226, Mode::Root, "daemon_flee");
}

#[test]
fn root_deep_daemon_chain_does_not_outlive_the_run() {
    daemon(64227, Mode::Root, "daemon_deep");
}

// Supervisor non-root: no cgroup; the child has the supervisor's uid.

#[test]
fn nonroot_fork_bomb_is_contained() {
    forkbomb(64230, Mode::NonRoot);
}

#[test]
fn nonroot_memory_bomb_is_contained() {
    membomb(64231, Mode::NonRoot);
}

/// Without a memory cgroup `--memory` is degraded (run here with --allow-degraded) and bounds
/// nothing. The report must say that no cgroup is in force; the gap is printed on every run
/// and documented in SECURITY.md.
#[test]
fn nonroot_memory_bomb_across_processes_is_bounded_per_process_only() {
    let Some(out) = membomb_multi(64232, Mode::NonRoot) else {
        return;
    };
    let a = out.attempt("membomb_multi");
    assert_eq!(
        out.layer("cgroup"),
        "not_requested",
        "a non-root supervisor has no cgroup"
    );
    assert!(a.num("total_mib") <= 4 * 80, "{a:?}");
    if a.outcome == "allowed" {
        support::probe::loud(&format!(
            "KNOWN GAP [nonroot] membomb_multi: {} (no memory cgroup without root)",
            a.detail
        ));
    }
}

#[test]
fn nonroot_disk_fill_stops_at_file_size() {
    diskfill(64233, Mode::NonRoot);
}

#[test]
fn nonroot_disk_fill_limit_is_per_file() {
    diskfill_many(64234, Mode::NonRoot);
}

#[test]
fn nonroot_setsid_daemon_does_not_outlive_the_run() {
    daemon(64235, Mode::NonRoot, "daemon_setsid");
}

/// A daemon that is a chain 300 processes deep, each waiting on its child. Without a cgroup
/// the supervisor's sweep (src/exec/tree.rs) must take the whole chain in one pass over a
/// parent-to-children map of /proc: a sweep that found only the top of the chain per round
/// would give up with the rest alive and report a clean exit. See SECURITY.md, "Findings".
#[test]
fn nonroot_deep_daemon_chain_does_not_outlive_the_run() {
    daemon(64236, Mode::NonRoot, "daemon_deep");
}

// Target uid 0 with every capability dropped: RLIMIT_NPROC does not apply to uid 0, so the
// pids cgroup alone holds the bomb.

#[test]
fn uid0_fork_bomb_is_contained_by_the_pids_cgroup() {
    let Some(run) = bomb(
        0,
        Mode::RootTargetUid0,
        "forkbomb",
        &["--pids", "64"],
        &["limit=64"],
    ) else {
        return;
    };
    assert_clean_end(&run, "uid 0 fork bomb");
    assert_eq!(run.out.layer("cgroup"), "enforced");
    let a = run.out.attempt("forkbomb");
    assert_eq!(
        (a.outcome.as_str(), a.errno),
        ("contained", Some(libc::EAGAIN)),
        "{a:?}"
    );
    assert!(a.num("alive") <= 64, "{a:?}");
}
