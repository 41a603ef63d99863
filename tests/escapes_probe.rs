//! Every known escape from inside `openshell-sandbox run`, tried by the probe
//! (tests/support/probe): it reports one JSON line per attempt; this file holds the run to the
//! table in tests/support/probe/expect.rs, and checks outside the sandbox what the probe cannot
//! see (signals at the witness, connections at the listeners, processes left behind). Links
//! left in a workdir for a later run are tried here too, with the probe as the later run.
//!
//! The set runs with the supervisor as root (the child becomes a test uid with every capability
//! dropped), with the supervisor itself non-root (the child keeps the supervisor's uid, so only
//! the sandbox separates them), with `--network all`, and with `--uid 0` (root without
//! capabilities). Resource bombs are in escapes_bombs.rs.
//!
//! Run: `cargo test --test escapes_probe` as root. The raw results of each run land in
//! target/tmp/probe-results/LABEL.jsonl; SECURITY.md holds the table.

mod support;

use support::probe::expect::{self, Ctx, Expect};
use support::probe::outside::{self, Listeners, TlsStandIn, Witness};
use support::probe::{Mode, Scene};

/// Everything one `probe all` run needs outside the sandbox.
struct Setup {
    scene: Scene,
    tls: TlsStandIn,
    listeners: Listeners,
    witness: Witness,
    targets: Vec<(&'static str, std::path::PathBuf)>,
    args: Vec<String>,
}

impl Setup {
    fn new(label: &str, uid: u32) -> Setup {
        let scene = Scene::new(uid);
        let tls = TlsStandIn::create(uid, label);
        let listeners = Listeners::new(&scene, label);
        let witness = Witness::start(&scene, uid);
        let targets = outside::kernel_targets();
        let mut args = vec!["all".to_string()];
        args.extend(scene.params());
        args.extend(listeners.params());
        args.push(format!("witness={}", witness.pid));
        args.push(format!("tls={}", tls.path.display()));
        args.extend(targets.iter().map(|(k, p)| format!("{k}={}", p.display())));
        Setup {
            scene,
            tls,
            listeners,
            witness,
            targets,
            args,
        }
    }
}

fn run_all(label: &str, uid: u32, mode: Mode, flags: &[&str], network_all: bool) {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let Setup {
        scene,
        tls,
        listeners,
        witness,
        targets,
        args,
    } = Setup::new(label, uid);
    // A hard RLIMIT_AS, so that raising it is an attempt at all.
    let mut run_flags = vec!["--address-space", "1GiB"];
    run_flags.extend_from_slice(flags);

    let out = support::probe::launch(&scene, mode, &run_flags, &args);
    let signals = witness.finish();
    let survivors = if uid == 0 {
        Vec::new()
    } else {
        let s = outside::survivors(uid);
        outside::kill_uid(&scene, uid);
        s
    };
    out.save(label);
    drop(tls);

    assert!(
        !out.hung,
        "`{label}`: the run did not end by itself; stderr:\n{}",
        out.stderr
    );
    assert!(
        out.status.success(),
        "`{label}`: supervisor ended with {:?} (a kill of the supervisor would show here)\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    for layer in ["landlock-fs", "landlock-scope", "seccomp", "identity"] {
        assert_eq!(
            out.layer(layer),
            "enforced",
            "`{label}`: layer {layer} in the report"
        );
    }

    let ctx = Ctx {
        mode,
        network_all,
        landlock_abi: out.landlock_abi(),
        targets,
        pid_namespace: out.layer("namespace-pid") == "enforced",
        private_tmp: out.layer("namespace-mount") == "enforced",
        private_net: out.layer("namespace-net") == "enforced",
        user_namespace: out.layer("namespace-user") == "enforced",
        // An enforced mount layer is a root of the granted paths only (a view without one is
        // reported degraded).
        view_root: out.layer("namespace-mount") == "enforced",
    };
    let mut failures = Vec::new();
    let mut gaps = Vec::new();
    for a in &out.attempts {
        // Panics on a name the table does not know.
        expect::expected(&a.name, &ctx);
        if out.attempts.iter().filter(|b| b.name == a.name).count() > 1 {
            failures.push(format!("{}: reported more than once", a.name));
        }
    }
    for name in expect::names() {
        let Some(a) = out.attempts.iter().find(|a| a.name == name) else {
            failures.push(format!("{name}: no result (did the probe crash?)"));
            continue;
        };
        let want = expect::expected(name, &ctx);
        if let Err(e) = expect::check(a, &want) {
            failures.push(e);
        }
        if let Expect::KnownGap(why) = want {
            gaps.push(format!("{name}: {} ({why})", a.detail));
        }
    }

    // What only the outside can see.
    if !signals.is_empty() {
        failures.push(format!(
            "the witness received signals {signals:?}: kill_witness, pidfd_send_signal_witness or sigio_to_witness got through"
        ));
    }
    if listeners.abstract_connected() {
        failures.push("a connection reached the abstract listener outside".into());
    }
    if listeners.dgram_received() {
        failures.push("a datagram reached the abstract socket outside".into());
    }
    let path_allowed = out.attempt("connect_pathname_unix_outside").outcome == "allowed";
    if listeners.path_connected() != path_allowed {
        failures.push("the pathname listener disagrees with connect_pathname_unix_outside".into());
    }
    let helper = out.attempt("exec_setuid_helper");
    if !helper.detail.ends_with(&format!("euid {uid}")) {
        failures.push(format!(
            "exec_setuid_helper: expected euid {uid}: {}",
            helper.detail
        ));
    }
    if !survivors.is_empty() {
        failures.push(format!(
            "processes of uid {uid} outlived the run: {survivors:?}"
        ));
    }

    for g in &gaps {
        support::probe::loud(&format!("KNOWN GAP [{label}] {g}"));
    }
    assert!(
        failures.is_empty(),
        "`{label}`: {} result(s) not as expected:\n  {}\n\nprobe output:\n{}\nsupervisor stderr:\n{}",
        failures.len(),
        failures.join("\n  "),
        out.stdout,
        out.stderr
    );
}

/// Supervisor root, child uid 64210 with every capability dropped.
#[test]
fn root_supervisor_blocks_every_escape() {
    run_all("root", 64210, Mode::Root, &[], false);
}

/// Supervisor uid 64211, child uid 64211: the same uid on both sides, so the supervisor's
/// secrets, its /proc files and its signals are guarded by the sandbox alone.
#[test]
fn nonroot_supervisor_blocks_every_escape() {
    run_all("nonroot", 64211, Mode::NonRoot, &[], false);
}

/// With `--network all`, IP and route netlink work (controls) and raw packet, vsock and other
/// netlink sockets are still refused.
#[test]
fn network_all_still_blocks_packet_vsock_and_netlink() {
    run_all(
        "root-network-all",
        64212,
        Mode::Root,
        &["--network", "all"],
        true,
    );
}

/// `--uid 0`: root without capabilities. Landlock, seccomp and the scopes hold; what uid 0
/// owns by file mode it can read (see SECURITY.md).
#[test]
fn uid0_child_without_capabilities_is_still_confined() {
    run_all("uid0", 0, Mode::RootTargetUid0, &[], false);
}

/// The probe is not vacuous: run bare, as the same uid and with the same targets, the escapes
/// that any unprivileged process has get through, and the outside sees them (the witness gets
/// both signals, the listeners get connections, the setuid bit works on this filesystem). Only
/// attempts whose success does not depend on a sysctl or kernel option are asserted.
#[test]
fn without_the_sandbox_the_same_attempts_get_through() {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let uid = 64213;
    let setup = Setup::new("bare", uid);
    let out = support::probe::launch_bare(&setup.scene, &setup.args);
    let signals = setup.witness.finish();
    outside::kill_uid(&setup.scene, uid);
    out.save("bare");
    let get_through = [
        "write_outside_workdir",
        "read_denied_secret",
        "read_default_tls_secret",
        "read_secret_via_proc_self_root",
        "symlink_read_escape",
        "hardlink_outside_in",
        "rename_secret_into_workdir",
        "read_witness_environ",
        "ptrace_attach_witness",
        "ptrace_traceme",
        "kill_witness",
        "pidfd_send_signal_witness",
        "socket_inet",
        "connect_abstract_outside",
        "sendto_abstract_dgram_outside",
        "connect_pathname_unix_outside",
        "clone3_newuser",
        "personality_no_randomize",
        "clear_no_new_privs",
        "exec_setuid_helper",
        "leak_inherited_fds",
        "leak_environment",
    ];
    let mut failures = Vec::new();
    for name in get_through {
        let a = out.attempt(name);
        if a.outcome != "allowed" {
            failures.push(format!(
                "{name}: {} {:?}: {}",
                a.outcome, a.errno_name, a.detail
            ));
        }
    }
    let sig = |n: i32| {
        signals
            .get(&n.to_string())
            .and_then(|v| v.as_i64())
            .unwrap_or(0)
    };
    if sig(libc::SIGUSR1) < 1 || sig(libc::SIGURG) < 1 {
        failures.push(format!(
            "the witness should have SIGUSR1 (kill) and SIGURG (pidfd_send_signal): {signals:?}"
        ));
    }
    if sig(libc::SIGUSR2) < 1 {
        failures.push(format!(
            "the witness should have SIGUSR2 from SIGIO: {signals:?}"
        ));
    }
    for (what, got) in [
        ("abstract stream", setup.listeners.abstract_connected()),
        ("abstract datagram", setup.listeners.dgram_received()),
        ("pathname", setup.listeners.path_connected()),
    ] {
        if !got {
            failures.push(format!("nothing reached the {what} socket"));
        }
    }
    assert!(
        failures.is_empty(),
        "without the sandbox these should have got through:\n  {}\n\nprobe output:\n{}",
        failures.join("\n  "),
        out.stdout
    );
}

/// Run 1 of a two-run attack: the sandboxed command, with the whole workdir its own, leaves
/// symlinks there (`ln -s TARGET NAME` for each pair).
fn plant_links(scene: &Scene, links: &[(&str, &str)]) {
    let script: String = links
        .iter()
        .map(|(target, name)| format!("ln -s {target} {} && ", scene.wd.join(name).display()))
        .collect::<String>()
        + "true";
    let st = std::process::Command::new(support::probe::BIN)
        .args(["run", "-q", "--uid", &scene.uid.to_string(), "--workdir"])
        .arg(&scene.wd)
        .args(["--", "/bin/sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "planting {links:?} failed: {st:?}");
}

/// Run 2: the same workdir with a denied directory below it, so its grant is split.
fn run_with_private_dir(scene: &Scene, attempt: &str) -> support::probe::Outcome {
    let private = scene.wd.join("private");
    std::fs::create_dir(&private).unwrap();
    std::os::unix::fs::chown(&private, Some(scene.uid), Some(scene.uid)).unwrap();
    let deny = private.display().to_string();
    let mut args = vec![attempt.to_string()];
    args.extend(scene.params());
    support::probe::launch(scene, Mode::Root, &["--deny", &deny], &args)
}

/// When a denied path lies below the workdir, the workdir's grant is split into its entries
/// (src/policy/fs.rs, `expand_one`), and a symlink among them is skipped, never granted as its
/// target: a link `escape -> /` left by an earlier run must not become read-write rules on
/// every top-level directory. See SECURITY.md, "Findings".
#[test]
fn symlink_left_in_the_workdir_does_not_widen_a_later_run() {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(64214);
    plant_links(&scene, &[("/", "escape")]);
    let out = run_with_private_dir(&scene, "write_outside_workdir");
    outside::kill_uid(&scene, scene.uid);
    assert!(!out.hung && out.status.success(), "{}", out.stderr);
    let a = out.attempt("write_outside_workdir");
    // With the view's own root the outside directory does not exist at all.
    let want = if out.layer("namespace-mount") == "enforced" {
        libc::ENOENT
    } else {
        libc::EACCES
    };
    assert_eq!(
        expect::check(a, &Expect::Errno(want)),
        Ok(()),
        "a symlink planted in the workdir widened the next run's grants"
    );
}

/// Three links to their own directory, followed, would make the same split exponential
/// (3^16 walks of the directory, src/policy/fs.rs `expand_one`) and the next run with a denied
/// path below the workdir would never get past preparing its sandbox; skipped, they cost
/// nothing.
#[test]
fn symlink_loops_left_in_the_workdir_do_not_stall_a_later_run() {
    if !support::probe::require_root_and_cc() {
        return;
    }
    let scene = Scene::new(64215);
    plant_links(&scene, &[(".", "a"), (".", "b"), (".", "c")]);
    let out = run_with_private_dir(&scene, "control_write_workdir");
    outside::kill_uid(&scene, scene.uid);
    assert!(
        !out.hung,
        "preparing the sandbox did not finish within {:?}: the grant expansion follows symlink loops",
        support::probe::HANG
    );
    assert!(out.status.success(), "{}", out.stderr);
}
