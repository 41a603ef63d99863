//! The pod as the v0.0.111 driver renders it: a tty main process alive with nobody attached,
//! the service-account token exchanged for a sandbox JWT, and the policy from the gateway.

use super::*;

/// The policy the gateway holds for the v0.0.111 pod: the image's programs and /etc, /proc
/// (for `tty`), the workspace, and nothing else (so /home is not readable).
fn head_pod_policy() -> SandboxPolicy {
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: true,
            read_only: ["/bin", "/sbin", "/usr", "/etc", "/proc"]
                .map(String::from)
                .to_vec(),
            read_write: vec!["/dev/null".into()],
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "best_effort".into(),
        }),
        ..Default::default()
    }
}

/// A pod as the v0.0.111 driver renders it. Its main process is the spec's default
/// `/bin/bash -l` with tty (busybox has no bash, so `/bin/sh -l`), on a terminal and alive with
/// nobody attached; the projected service-account token is exchanged for a sandbox JWT; the
/// policy comes from the gateway (LOADED reported) and execs run under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_pod_tty_main_process_sa_token_and_gateway_policy() {
    let Some(bin) = preconditions() else {
        return;
    };
    let sc = Scenario::new("v0.0.111 pod");
    let tmp = tempdir();
    let dir = tmp.path();
    let sha = sc.ok(sha256_file(&bin));

    sc.step("1 node: install");
    let node = sc.ok(Node::new(&dir.join("node")));
    sc.ok(install(&sc, &node, dir, "v1", &bin).await);
    check_installed(&sc, &node, &sha);

    sc.step("2+3 pod: busybox image, v0.0.111 pod contract");
    let mut cluster = sc.ok(Cluster::new(dir));
    let mut netns_names = vec![cluster.gw_ns.name.clone()];
    let spec = serde_json::json!({ "version": 1, "command": ["/bin/bash", "-l"], "tty": true });
    let name = "sandbox-head";
    let pod = Pod::start(
        &mut cluster,
        &node,
        &dir.join("pods"),
        PodOptions {
            name,
            image: &busybox_with_secret,
            seccomp: Seccomp::RuntimeDefault,
            contract: Contract::V00111 {
                main_spec: spec.to_string(),
                user_env: r#"{"OSB_E2E_CONTRACT":"v0.0.111"}"#.into(),
                policy: Box::new(head_pod_policy()),
            },
        },
        |log| sc.watch_log(&format!("pod {name} (the supervisor)"), log),
    )
    .await;
    let mut p = sc.ok(pod);
    netns_names.push(p.net.ns.name.clone());
    let ns = sc.ok(p.namespaces());
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.init_pid)).unwrap_or_default();
    sc.check(
        cmdline == format!("{SUPERVISOR}\0--workdir\0/sandbox\0").as_bytes(),
        || {
            format!(
                "PID 1's command line is {:?}",
                String::from_utf8_lossy(&cmdline)
            )
        },
    );

    sc.step("4 the service-account token was exchanged for a sandbox JWT");
    let st = p.state().clone();
    let seen = st.seen();
    sc.check(seen.issued == 1, || {
        format!(
            "IssueSandboxToken was called {} times, expected once",
            seen.issued
        )
    });
    let bearer = seen.hello_auth.first().cloned().flatten();
    sc.check(bearer.as_deref() != Some(st.sa_token.as_str()), || {
        "the hello carried the service-account token itself, not the exchanged JWT".into()
    });
    let claims = bearer.as_deref().map(|b| st.jwt.verify(b));
    sc.check(
        matches!(&claims, Some(Ok(c)) if c.sandbox_id == p.sandbox_id),
        || format!("the hello's bearer is not a sandbox JWT for this pod: {claims:?}"),
    );

    sc.step("4 the policy came from the gateway and was reported LOADED");
    let want = st.current_revision().map(|r| r.version);
    let loaded = sc.ok(wait_for(
        Duration::from_secs(30),
        "a ReportPolicyStatus of the gateway's version",
        || {
            Ok(st
                .policy_reports()
                .into_iter()
                .find(|r| Some(r.version) == want))
        },
    )
    .await);
    sc.check(loaded.status == PolicyStatus::Loaded as i32, || {
        format!("the gateway's version {want:?} was not LOADED: {loaded:?}")
    });

    sc.step("5 the main process lives on a terminal with nobody attached");
    tokio::time::sleep(Duration::from_secs(3)).await;
    sc.check(sc.ok(p.container.try_status()).is_none(), || {
        "the pod ended while nobody was attached".into()
    });
    sc.check(st.seen().reports.is_empty(), || {
        format!(
            "the main process exited unattached: {:?}",
            st.seen().reports
        )
    });
    let mut a = match Attacher::attach(&st, Some((80, 24)), false).await {
        Ok(a) => a,
        Err(e) => sc.fail(format!("attaching to openshell-main: {e}")),
    };
    a.send(b"[ -t 0 ] && [ -t 1 ] && echo TTY-$((6*7)) $(tty) $0\r")
        .await;
    if !a
        .read_until(Duration::from_secs(20), |a| {
            a.out().contains("TTY-42 /dev/pts/")
        })
        .await
    {
        sc.fail(format!(
            "the main process did not answer on a terminal: stdout {:?}, stderr {:?}",
            a.out(),
            a.err()
        ));
    }
    let out = a.out();
    let answer = &out[out.find("TTY-42").unwrap_or(0)..];
    sc.check(answer.split_whitespace().nth(2) == Some("/bin/sh"), || {
        format!("the default main process on an image without bash is not /bin/sh: {answer:?}")
    });
    // Ctrl-P Ctrl-Q detaches; the main process keeps running.
    a.send(b"\x10\x11").await;
    if !a.read_until(Duration::from_secs(20), |a| a.closed).await && !a.closed {
        sc.fail("the detached attachment was not closed");
    }
    sc.check(a.exit == Some(0), || {
        format!("detach exit-status {:?}", a.exit)
    });
    sc.check(sc.ok(p.container.try_status()).is_none(), || {
        "the pod ended after a detach".into()
    });

    sc.step("5 exec under the gateway's policy");
    let r = p
        .sh("echo $OSB_E2E_CONTRACT $(id -u) > /sandbox/w && cat /sandbox/w")
        .await;
    check_exec(&sc, "an exec writing the workspace", &r, |r| {
        r.exit == Some(0) && r.out() == format!("v0.0.111 {}\n", pod::HEAD_SANDBOX_UID)
    });
    // Outside the policy the file does not exist in the view's root (ENOENT), though it is
    // world-readable in the image.
    let r = p.exec(&["cat", "/home/secret.txt"]).await;
    check_exec(&sc, "reading outside the policy", &r, |r| {
        r.exit == Some(1) && r.err().contains("No such file or directory")
    });

    sc.step("7 teardown");
    terminate(&sc, &mut p, ns, false).await;
    drop(p);
    gateway_namespace_is_bare(&sc, &cluster).await;
    sc.ok(cluster.gw_ns.delete());
    drop(cluster);
    check_host_clean(&sc, dir, &netns_names);
    eprintln!(
        "v0.0.111 scenario done in {:.1}s",
        sc.elapsed().as_secs_f64()
    );
}
