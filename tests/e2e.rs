//! End to end without a cluster: a simulated node and sandbox pods, from the
//! installer to streamed output. See docs/e2e.md for how each piece maps onto Kubernetes.
//!
//! The static release build (`make static`, path in OSB_STATIC_BIN) is what runs: the node
//! installer copies it onto the node's hostPath from the installer image, and sandbox pods run
//! it from there, read-only, inside a foreign root filesystem with no libc, as PID 1 of a container
//! that a real OCI runtime (runc; crun with OSB_E2E_RUNTIME=crun) starts the way containerd
//! starts the pod's `agent` container: its own mount, PID, IPC, UTS and cgroup namespaces, the
//! pod's network namespace, the capabilities of, containerd's masked and
//! read-only paths, a read-only /sys/fs/cgroup, and no seccomp profile or a RuntimeDefault-like
//! one. Each pod dials the test gateway by DNS name over mTLS across its own veth link; every
//! exec goes through the gateway's ExecSandbox.
//!
//! Needs root, runc, util-linux, iproute2, Debian's busybox-static and, for the python pod, the
//! distribution's python3. Without them the tests skip loudly; with CI=true a skip is a failure.

mod support;

#[path = "e2e/checks.rs"]
mod checks;
#[path = "e2e/cluster.rs"]
mod cluster;
#[path = "e2e/container.rs"]
mod container;
#[path = "e2e/head_pod.rs"]
mod head_pod;
#[path = "e2e/images.rs"]
mod images;
#[path = "e2e/pod.rs"]
mod pod;
#[path = "e2e/scenario.rs"]
mod scenario;
#[path = "e2e/seccomp.rs"]
mod seccomp;

use std::path::{Path, PathBuf};
use std::time::Duration;

use openshell_sandbox::policy::openshell::{FilesystemPolicy, LandlockPolicy, SandboxPolicy};
use openshell_sandbox::proto::v1::PolicyStatus;
use openshell_sandbox::proto::v1::exec_sandbox_event::Payload;

use cluster::{Cluster, GATEWAY_DNS, GATEWAY_PORT};
use container::{
    Container, Seccomp, Spec, Volume, describe, ns_pid, processes_in_ns, runtime_name, tool,
};
use images::{INSTALLER_MOUNT, Node, sha256_file};
use pod::{Contract, Pod, PodNamespaces, PodOptions, SUPERVISOR, TLS_DIR};
use scenario::{Scenario, wait_for};
use support::connect::Attacher;
use support::exec::ExecResult;

/// Everything the simulation needs, or the reason it cannot run. Returns the static binary.
fn preconditions() -> Option<PathBuf> {
    // Image layers carry 0755 directories and 0644 files; a restrictive umask of whoever runs
    // the tests must not leak into the images, the node or the pod's files.
    // SAFETY: umask(2) has no preconditions and touches no memory.
    unsafe { libc::umask(0o022) };
    if !support::require(
        support::is_root(),
        "the end-to-end simulation needs root (namespaces, mounts, veth pairs, chroot)",
    ) {
        return None;
    }
    let bin = std::env::var_os("OSB_STATIC_BIN").map(PathBuf::from);
    if !support::require(
        bin.as_ref().is_some_and(|b| b.is_file()),
        "OSB_STATIC_BIN must name the static build (`make static`; `make e2e` sets it)",
    ) {
        return None;
    }
    for t in ["ip", "ldd"] {
        if !support::require(tool(t).is_some(), &format!("`{t}` (iproute2, libc-bin)")) {
            return None;
        }
    }
    let rt = runtime_name();
    if !support::require(
        tool(&rt).is_some(),
        &format!("the OCI runtime `{rt}` (apt-get install {rt})"),
    ) {
        return None;
    }
    if !support::require(
        Path::new(images::BUSYBOX).is_file(),
        "/bin/busybox from Debian's busybox-static (apt-get install busybox-static)",
    ) {
        return None;
    }
    bin
}

/// The run's files. With OSB_E2E_KEEP=1 they stay for inspection (namespaces, mounts and
/// processes are removed all the same).
fn tempdir() -> tempfile::TempDir {
    let mut dir = tempfile::Builder::new()
        .prefix("osb-e2e-")
        .tempdir()
        .expect("creating a temporary directory");
    if std::env::var("OSB_E2E_KEEP").as_deref() == Ok("1") {
        dir.disable_cleanup(true);
        eprintln!("OSB_E2E_KEEP=1: keeping {}", dir.path().display());
    }
    dir
}

/// The node installer as the DaemonSet runs it: the installer image, read-only root, the
/// hostPath mounted at /host/opt/openshell/bin (read-write for `install`, read-only for the
/// `--verify` readiness probe).
fn installer_spec(node: &Node, image: &Path, args: &[&str], log: PathBuf) -> Spec {
    let read_only = args.contains(&"--verify");
    let mut argv = vec!["/openshell-sandbox".to_owned()];
    argv.extend(args.iter().map(|s| s.to_string()));
    argv.extend(["--dest".to_owned(), INSTALLER_MOUNT.to_owned()]);
    Spec {
        hostname: "openshell-node-installer".into(),
        rootfs: image.to_owned(),
        read_only_root: true,
        volumes: vec![Volume {
            host: node.host_path.clone(),
            path: INSTALLER_MOUNT.into(),
            read_only,
        }],
        netns: None,
        env: vec![(
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        )],
        argv,
        log,
        add_caps: Vec::new(),
        // The DaemonSet's pod-level seccompProfile.
        seccomp: Seccomp::RuntimeDefault,
    }
}

/// Step 1: lay out the installer image for `bin`, run the init container, then the readiness
/// probe. Returns the installer's output.
async fn install(
    sc: &Scenario,
    node: &Node,
    dir: &Path,
    tag: &str,
    bin: &Path,
) -> anyhow::Result<String> {
    let image = dir.join(format!("images/installer-{tag}"));
    std::fs::create_dir_all(image.parent().unwrap())?;
    images::installer_image(&image, bin)?;
    let log = dir.join(format!("installer-{tag}.log"));
    sc.watch_log(&format!("node installer ({tag})"), &log);
    let (st, out) = Container::run(
        &installer_spec(node, &image, &["install"], log),
        Duration::from_secs(60),
    )
    .await?;
    if !st.success() {
        anyhow::bail!("the installer init container ended with {}", describe(&st));
    }
    let log = dir.join(format!("installer-{tag}-verify.log"));
    sc.watch_log(&format!("readiness probe ({tag})"), &log);
    let (st, probe) = Container::run(
        &installer_spec(node, &image, &["install", "--verify"], log),
        Duration::from_secs(60),
    )
    .await?;
    if !st.success() {
        anyhow::bail!(
            "the readiness probe `install --verify` ended with {}: {probe}",
            describe(&st)
        );
    }
    Ok(out)
}

fn check_installed(sc: &Scenario, node: &Node, want_sha: &str) {
    let got = sc.ok(sha256_file(&node.binary()));
    sc.check(got == want_sha, || {
        format!("the hostPath holds sha256 {got}, expected {want_sha}")
    });
    let mode = std::fs::metadata(node.binary())
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777);
    sc.check(matches!(mode, Ok(0o755)), || {
        format!("the installed binary's mode is {mode:?}, expected 0755")
    });
    let marker = sc.ok(node.marker_sha());
    sc.check(marker == want_sha, || {
        format!("the installer's marker records sha256 {marker}, expected {want_sha}")
    });
}

async fn start_pod(
    sc: &Scenario,
    cluster: &mut Cluster,
    node: &Node,
    dir: &Path,
    name: &str,
    image: &dyn Fn(&Path) -> anyhow::Result<()>,
    seccomp: Seccomp,
) -> Pod {
    let pod = Pod::start(
        cluster,
        node,
        &dir.join("pods"),
        PodOptions {
            name,
            image,
            seccomp,
            contract: Contract::V0036,
        },
        |log| sc.watch_log(&format!("pod {name} (the supervisor)"), log),
    )
    .await;
    sc.ok(pod)
}

/// Step 3's checks: the pod's PID 1 is the supervisor, started with no flags, in namespaces of
/// its own.
fn check_pod_shape(sc: &Scenario, pod: &Pod) -> PodNamespaces {
    let pid = pod.init_pid;
    sc.check(ns_pid(pid) == Some(1), || {
        format!(
            "pod {}: host pid {pid} is pid {:?} in its namespace, not 1",
            pod.name,
            ns_pid(pid)
        )
    });
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    sc.check(cmdline == format!("{SUPERVISOR}\0").as_bytes(), || {
        format!(
            "PID 1's command line is {:?}, expected exactly {SUPERVISOR:?} with no flags",
            String::from_utf8_lossy(&cmdline)
        )
    });
    let ns = sc.ok(pod.namespaces());
    let me = std::process::id() as i32;
    for (kind, theirs) in [
        ("pid", ns.pid),
        ("mnt", ns.mnt),
        ("uts", ns.uts),
        ("net", ns.net),
    ] {
        sc.check(container::ns_inode(me, kind) != Some(theirs), || {
            format!("pod {} shares the test's {kind} namespace", pod.name)
        });
    }
    checks::runtime_shape(sc, pod);
    ns
}

fn check_exec(sc: &Scenario, what: &str, r: &ExecResult, ok: impl FnOnce(&ExecResult) -> bool) {
    sc.check(ok(r), || {
        format!(
            "{what}: unexpected result: exit {:?}, status {:?}\nstdout: {:?}\nstderr: {:?}",
            r.exit,
            r.status,
            r.out(),
            r.err()
        )
    });
}

/// Step 7: SIGTERM to the pod's PID 1 from outside (as kubelet does), exit 0, then nothing of
/// the pod left: no process in its PID namespace, none in its mount namespace (so no mount),
/// and, once the pod network is removed, no namespace or veth.
async fn terminate(sc: &Scenario, pod: &mut Pod, ns: PodNamespaces, already_signalled: bool) {
    if !already_signalled {
        sigterm(sc, pod.init_pid);
    }
    let st = sc.ok(pod.container.wait(Duration::from_secs(90)).await);
    sc.check(st.code() == Some(0), || {
        format!(
            "the supervisor ended with {} after SIGTERM, expected exit code 0",
            describe(&st)
        )
    });
    let log = pod.container.log_text();
    sc.check(log.contains("SIGTERM: shutting down"), || {
        "the supervisor's log does not show the SIGTERM shutdown".into()
    });
    for (kind, inode) in [("pid", ns.pid), ("mnt", ns.mnt), ("uts", ns.uts)] {
        // Processes that are already dying (helpers that entered the pod's namespaces, the
        // runtime's own wrapper) can still be listed for a moment after PID 1 is gone: wait
        // for them, with a limit, before calling them leftovers.
        let mut left = processes_in_ns(kind, inode);
        for _ in 0..100 {
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            left = processes_in_ns(kind, inode);
        }
        sc.check(left.is_empty(), || {
            format!("processes left in the pod's {kind} namespace: {left:?}")
        });
    }
    let cgroups: Vec<_> = pod
        .container
        .cgroup_dirs()
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    sc.check(cgroups.is_empty(), || {
        format!("the pod's cgroups are left: {cgroups:?}")
    });
    sc.ok(pod.net.ns.delete());
    let left = processes_in_ns("net", ns.net);
    sc.check(left.is_empty(), || {
        format!("processes left in the pod's network namespace: {left:?}")
    });
    sc.check(!pod.net.ns.path.exists(), || {
        format!("{} still exists", pod.net.ns.path.display())
    });
}

/// With the pods' namespaces gone, their veth pairs go too, the gateway's ends included. The
/// kernel tears a network namespace down asynchronously (a workqueue runs after the last
/// reference is dropped), so this waits for it, bounded.
async fn gateway_namespace_is_bare(sc: &Scenario, cluster: &Cluster) {
    let mut left = Vec::new();
    let r = wait_for(
        Duration::from_secs(30),
        "the pods' veth ends to leave the gateway's namespace",
        || {
            left = cluster.gateway_interfaces()?;
            Ok((left == ["lo"]).then_some(()))
        },
    )
    .await;
    if let Err(e) = r {
        sc.fail(format!("{e:#}; interfaces there: {left:?}"));
    }
}

fn sigterm(sc: &Scenario, pid: i32) {
    // SAFETY: kill(2) on a pid this test started; no memory is involved.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    sc.check(rc == 0, || {
        format!(
            "kill(SIGTERM) of {pid}: {}",
            std::io::Error::last_os_error()
        )
    });
}

/// Nothing of the run is mounted on the host, and none of its namespaces is left.
fn check_host_clean(sc: &Scenario, dir: &Path, netns_names: &[String]) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let d = dir.display().to_string();
    let leaked: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(&d) || netns_names.iter().any(|n| l.contains(n.as_str())))
        .collect();
    sc.check(leaked.is_empty(), || {
        format!("mounts left on the host: {leaked:#?}")
    });
    let listed = std::process::Command::new(tool("ip").unwrap_or_else(|| "ip".into()))
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for n in netns_names {
        sc.check(!listed.contains(n.as_str()), || {
            format!("network namespace {n} is still listed:\n{listed}")
        });
    }
}

/// The "different build" of step 6: the same binary with bytes appended (the loader ignores
/// them), so its sha256 differs.
fn write_upgrade(bin: &Path, to: &Path) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(bin)?;
    bytes.extend_from_slice(b"\0openshell-e2e: appended so the upgrade has a different sha256\n");
    std::fs::write(to, &bytes)?;
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(())
}

/// The busybox image, with the check that it is what the scenario needs: busybox, its applet
/// links and pod directories, and no libc.
fn busybox_image(root: &Path) -> anyhow::Result<()> {
    images::busybox_rootfs(root)?;
    let files = images::regular_files(root)?;
    if files != ["bin/busybox", "etc/group", "etc/passwd"] {
        anyhow::bail!("the busybox image holds more than busybox: {files:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busybox_pod_from_installer_to_streamed_output() {
    busybox_scenario("busybox", Seccomp::Unconfined).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busybox_pod_under_runtime_default_seccomp() {
    busybox_scenario("busybox-runtime-default", Seccomp::RuntimeDefault).await;
}

async fn busybox_scenario(name: &'static str, seccomp: Seccomp) {
    let Some(bin) = preconditions() else {
        return;
    };
    let sc = Scenario::new(name);
    let tmp = tempdir();
    let dir = tmp.path();
    let sha1 = sc.ok(sha256_file(&bin));

    sc.step("1 node: the DaemonSet's installer copies the static binary onto the hostPath");
    let node = sc.ok(Node::new(&dir.join("node")));
    let out = sc.ok(install(&sc, &node, dir, "v1", &bin).await);
    sc.check(out.contains("installed"), || {
        format!("the installer did not report a fresh install: {out}")
    });
    check_installed(&sc, &node, &sha1);

    sc.step("2+3 pod A: busybox image, v0.0.36 pod contract, its own namespaces");
    let mut cluster = sc.ok(Cluster::new(dir));
    let mut netns_names = vec![cluster.gw_ns.name.clone()];
    let mut a = start_pod(
        &sc,
        &mut cluster,
        &node,
        dir,
        "sandbox-a",
        &busybox_image,
        seccomp,
    )
    .await;
    netns_names.push(a.net.ns.name.clone());
    let ns_a = check_pod_shape(&sc, &a);
    let row = checks::supervisor_on_read_only_cgroups(&sc, &a);
    eprintln!("the supervisor on the pod's read-only cgroup mount: {row}");

    sc.step("4 network: the pod reached the gateway by DNS name, across its veth only");
    let ifaces = sc.ok(a.net.interfaces());
    sc.check(ifaces == ["lo", "eth0"], || {
        format!("the pod's network namespace has {ifaces:?}, expected only lo and eth0")
    });
    let hellos = a.state().seen().hellos;
    sc.check(
        hellos.len() == 1 && hellos[0].sandbox_id == a.sandbox_id,
        || {
            format!(
                "the gateway saw hellos {hellos:?}, expected one for {}",
                a.sandbox_id
            )
        },
    );
    // The same address from the pod's namespace, outside the sandbox: reachable. This is what
    // makes the exec's failure below the sandbox's doing, not the network's.
    let gw = a.net.gateway_addr();
    let direct = sc.ok(a.net.ns.enter(move || {
        std::net::TcpStream::connect_timeout(&gw, Duration::from_secs(10)).map(|_| ())
    }));
    sc.check(direct.is_ok(), || {
        format!("the pod's network namespace cannot reach the gateway at {gw}: {direct:?}")
    });

    sc.step("5 exec through ExecSandbox");
    let r = a.exec(&["echo", "hello"]).await;
    check_exec(&sc, "echo hello", &r, |r| {
        r.exit == Some(0) && r.out() == "hello\n" && r.stderr.is_empty()
    });
    let r = a.sh("echo err >&2; exit 3").await;
    check_exec(&sc, "sh -c 'echo err >&2; exit 3'", &r, |r| {
        r.exit == Some(3) && r.err() == "err\n" && r.stdout.is_empty()
    });
    // The pod as the exec sees it: PID 1 is the supervisor's init (a clone of it that names
    // itself openshell-init), the hostname is the sandbox view's, and the command runs as the
    // unprivileged sandbox uid.
    let r = a
        .sh("tr -d '\\0' < /proc/1/cmdline; echo; hostname; id -u")
        .await;
    let want = format!("{}\nsandbox\n65534\n", checks::INIT_NAME);
    check_exec(&sc, "the view from inside the pod", &r, |r| {
        r.exit == Some(0) && r.out() == want
    });
    // The hostPath cannot be written: neither a new file nor the binary itself. /opt/openshell
    // is denied inside the granted /opt, so the view covers it with an empty mode-000 mount:
    // EACCES from the file mode, before the read-only mount or Landlock is asked.
    for target in ["/opt/openshell/bin/planted", SUPERVISOR] {
        let r = a.sh(&format!(": > {target}")).await;
        check_exec(&sc, &format!("a write to {target}"), &r, |r| {
            r.exit != Some(0) && r.err().contains("Permission denied")
        });
    }
    sc.check(!node.host_path.join("planted").exists(), || {
        "a file appeared in the node's hostPath".into()
    });
    check_installed(&sc, &node, &sha1);
    // The key is world-readable on the node (a Secret volume's default 0644), so its absence
    // is the sandbox's doing, not file permissions: the view's /etc/openshell-tls is a tmpfs
    // of its own holding only the sandbox CA's two public files, so the client directory is
    // not there at all (and Landlock denies the host's directory besides).
    let r = a.exec(&["cat", &format!("{TLS_DIR}/tls.key")]).await;
    check_exec(&sc, "reading the client key", &r, |r| {
        r.exit == Some(1)
            && r.err().contains("No such file or directory")
            && !r.out().contains("PRIVATE")
    });
    // A TCP connect to the gateway, by address and by name: the exec's network namespace has
    // only `lo`, so the connect cannot leave it.
    for host in [a.net.gw_addr.to_string(), GATEWAY_DNS.to_owned()] {
        let r = a
            .exec(&["nc", "-w", "5", &host, &GATEWAY_PORT.to_string()])
            .await;
        check_exec(
            &sc,
            &format!("a TCP connect to {host}:{GATEWAY_PORT}"),
            &r,
            |r| r.exit == Some(1) && r.err().contains("Network is unreachable"),
        );
    }
    // The handshake secret from the pod's env never reaches an exec.
    let r = a.exec(&["env"]).await;
    check_exec(&sc, "env", &r, |r| {
        r.exit == Some(0)
            && !r.out().contains(&a.handshake_secret)
            && !r.out().contains("OPENSHELL_TLS")
    });

    // The pod's cgroup mounts are read-only, yet the exec has a pids group of its own (made
    // through the supervisor's private read-write copy), visible through the cgroup
    // namespace as a path below the pod's own group.
    let r = a.sh("grep ':pids:' /proc/self/cgroup").await;
    check_exec(&sc, "the exec's pids cgroup", &r, |r| {
        r.exit == Some(0) && r.out().contains("/openshell-owned-")
    });

    sc.step("5 exec: the sandbox's private view inside the pod");
    checks::namespaces_in_pod(&sc, &a).await;

    sc.step("6 upgrade: a different build on the node while pod A runs");
    let bin2 = dir.join("openshell-sandbox-v2");
    sc.ok(write_upgrade(&bin, &bin2));
    let sha2 = sc.ok(sha256_file(&bin2));
    let out = sc.ok(install(&sc, &node, dir, "v2", &bin2).await);
    sc.check(out.contains("replaced"), || {
        format!("the installer did not report a replacement: {out}")
    });
    check_installed(&sc, &node, &sha2);
    // Pod A keeps running the binary it started from (now unlinked) and keeps serving.
    let exe_a = std::fs::read_link(format!("/proc/{}/exe", a.init_pid)).unwrap_or_default();
    sc.check(exe_a.to_string_lossy().ends_with(" (deleted)"), || {
        format!(
            "pod A's PID 1 runs {}, expected the replaced (deleted) binary",
            exe_a.display()
        )
    });
    let running = sc.ok(sha256_file(Path::new(&format!("/proc/{}/exe", a.init_pid))));
    sc.check(running == sha1, || {
        format!("pod A's PID 1 runs sha256 {running}, expected the old {sha1}")
    });
    let r = a.exec(&["echo", "still serving"]).await;
    check_exec(&sc, "pod A after the upgrade", &r, |r| {
        r.exit == Some(0) && r.out() == "still serving\n"
    });
    let mut b = start_pod(
        &sc,
        &mut cluster,
        &node,
        dir,
        "sandbox-b",
        &busybox_image,
        seccomp,
    )
    .await;
    netns_names.push(b.net.ns.name.clone());
    let ns_b = check_pod_shape(&sc, &b);
    let running = sc.ok(sha256_file(Path::new(&format!("/proc/{}/exe", b.init_pid))));
    sc.check(running == sha2, || {
        format!("the new pod B runs sha256 {running}, expected the upgrade's {sha2}")
    });
    let r = b.exec(&["echo", "hello"]).await;
    check_exec(&sc, "echo hello in pod B", &r, |r| {
        r.exit == Some(0) && r.out() == "hello\n"
    });

    sc.step("7 teardown: SIGTERM drains an exec in flight, exits 0, leaves nothing");
    // An exec that is running when the pod is stopped: it gets SIGTERM, its output and exit
    // status still reach the gateway's client.
    let mut rx = match support::exec::exec_stream(
        a.state().clone(),
        a.request(&[
            "sh",
            "-c",
            "trap 'echo drained; exit 7' TERM; echo started; while :; do sleep 1; done",
        ]),
    )
    .await
    {
        Ok(rx) => rx,
        Err(s) => sc.fail(format!("starting the long exec: {s}")),
    };
    let mut out = String::new();
    let mut exit = None;
    let mut signalled = false;
    let limit = Duration::from_secs(120);
    let deadline = tokio::time::Instant::now() + limit;
    while let Some(ev) = tokio::time::timeout_at(deadline, rx.recv())
        .await
        .unwrap_or_else(|_| {
            sc.fail(format!(
                "the long exec did not end within {limit:?}; output {out:?}"
            ))
        })
    {
        match ev {
            Ok(ev) => match ev.payload {
                Some(Payload::Stdout(d)) => out.push_str(&String::from_utf8_lossy(&d.data)),
                Some(Payload::Exit(e)) => exit = Some(e.exit_code),
                _ => {}
            },
            Err(s) => sc.fail(format!(
                "the long exec's stream failed: {s} (output so far {out:?})"
            )),
        }
        if !signalled && out.contains("started\n") {
            signalled = true;
            sigterm(&sc, a.init_pid);
        }
    }
    sc.check(out == "started\ndrained\n" && exit == Some(7), || {
        format!("the exec in flight at SIGTERM gave {out:?} and exit {exit:?}, expected \"started\\ndrained\\n\" and 7")
    });
    terminate(&sc, &mut a, ns_a, true).await;
    let reports = a.state().seen().reports;
    sc.check(
        reports.len() == 1 && reports[0].exit_code == 128 + libc::SIGTERM,
        || {
            format!(
                "main process exit reports {reports:?}, expected one with {}",
                128 + libc::SIGTERM
            )
        },
    );
    terminate(&sc, &mut b, ns_b, false).await;
    drop(a);
    drop(b);
    gateway_namespace_is_bare(&sc, &cluster).await;
    sc.ok(cluster.gw_ns.delete());
    drop(cluster);
    check_host_clean(&sc, dir, &netns_names);
    eprintln!(
        "busybox scenario done in {:.1}s",
        sc.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_pod_runs_generated_code() {
    let Some(bin) = preconditions() else {
        return;
    };
    if !support::require(
        Path::new(images::HOST_PYTHON).exists(),
        "the distribution's /usr/bin/python3 (apt-get install python3) for the python pod",
    ) {
        return;
    }
    let sc = Scenario::new("python");
    let tmp = tempdir();
    let dir = tmp.path();
    let sha = sc.ok(sha256_file(&bin));

    sc.step("1 node: install");
    let node = sc.ok(Node::new(&dir.join("node")));
    sc.ok(install(&sc, &node, dir, "v1", &bin).await);
    check_installed(&sc, &node, &sha);

    sc.step("2+3 pod: busybox plus python3, v0.0.36 pod contract");
    let mut cluster = sc.ok(Cluster::new(dir));
    let mut netns_names = vec![cluster.gw_ns.name.clone()];
    let image = |root: &Path| -> anyhow::Result<()> {
        images::busybox_rootfs(root)?;
        images::add_python(root)?;
        Ok(())
    };
    let mut p = start_pod(
        &sc,
        &mut cluster,
        &node,
        dir,
        "sandbox-py",
        &image,
        Seccomp::RuntimeDefault,
    )
    .await;
    netns_names.push(p.net.ns.name.clone());
    let ns = check_pod_shape(&sc, &p);

    sc.step("5 exec: generated python code, fed on stdin");
    let program = r#"
import hashlib, json, math
primes = [n for n in range(2, 1000) if all(n % d for d in range(2, math.isqrt(n) + 1))]
print(json.dumps({"count": len(primes), "sum": sum(primes),
                  "sha256": hashlib.sha256(b"openshell").hexdigest()}, sort_keys=True))
"#;
    let r = p.exec_stdin(&["python3", "-"], program).await;
    let want_sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"openshell"))
    };
    let want = format!("{{\"count\": 168, \"sha256\": \"{want_sha}\", \"sum\": 76127}}\n");
    check_exec(&sc, "the generated program", &r, |r| {
        r.exit == Some(0) && r.out() == want && r.stderr.is_empty()
    });

    sc.step("5 exec: the python program meets the sandbox (exact errnos)");
    let probe = format!(
        r#"
import errno, os, socket
def attempt(what, f):
    try:
        f()
        print(what, "ALLOWED")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
attempt("write-hostpath", lambda: open("/opt/openshell/bin/planted", "w"))
attempt("read-key", lambda: open("{TLS_DIR}/tls.key").read())
attempt("connect", lambda: socket.create_connection(("{gw}", {port}), timeout=5))
attempt("connect-by-name", lambda: socket.create_connection(("{GATEWAY_DNS}", {port}), timeout=5))
"#,
        gw = p.net.gw_addr,
        port = GATEWAY_PORT
    );
    let r = p.exec_stdin(&["python3", "-"], &probe).await;
    // read-key: the view's /etc/openshell-tls holds only the sandbox CA's public files.
    let want = "write-hostpath EACCES\nread-key ENOENT\nconnect ENETUNREACH\nconnect-by-name ENETUNREACH\n";
    check_exec(&sc, "the sandbox probes", &r, |r| {
        r.exit == Some(0) && r.out() == want
    });

    sc.step("5 exec: the sandbox's private view inside the pod");
    checks::namespaces_in_pod(&sc, &p).await;

    sc.step("7 teardown");
    terminate(&sc, &mut p, ns, false).await;
    drop(p);
    gateway_namespace_is_bare(&sc, &cluster).await;
    sc.ok(cluster.gw_ns.delete());
    drop(cluster);
    check_host_clean(&sc, dir, &netns_names);
    eprintln!("python scenario done in {:.1}s", sc.elapsed().as_secs_f64());
}

/// The busybox image plus a file outside every grant of the pod's policy.
fn busybox_with_secret(root: &Path) -> anyhow::Result<()> {
    images::busybox_rootfs(root)?;
    std::fs::write(root.join("home/secret.txt"), "not granted\n")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("home/secret.txt"),
        std::fs::Permissions::from_mode(0o644),
    )?;
    Ok(())
}
