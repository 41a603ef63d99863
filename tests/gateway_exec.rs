//! Exec through the real binary and a faithful test gateway (mTLS, sandbox JWT).

mod support;

use sha2::{Digest, Sha256};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_stderr_and_exit_code() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let r = gw.sh("echo out; echo err >&2; exit 7").await;
    assert!(r.status.is_none(), "{r:?}");
    assert_eq!(r.out(), "out\n");
    assert_eq!(r.err(), "err\n");
    assert_eq!(r.exit, Some(7));
    let r = gw.exec(&["true"]).await;
    assert_eq!(r.exit, Some(0), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_by_signal_is_128_plus_n() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let r = gw.sh("kill -KILL $$").await;
    assert_eq!(r.exit, Some(137), "{r:?}");
    let r = gw.sh("kill -TERM $$").await;
    assert_eq!(r.exit, Some(143), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_reaches_the_child() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let mut req = gw.request(&["sh", "-c", "tr a-z A-Z; echo done"]);
    req.stdin = b"hello stdin\n".to_vec();
    let r = exec_collect(gw.state.clone(), req).await;
    assert_eq!(r.out(), "HELLO STDIN\ndone\n", "{r:?}");
    assert_eq!(r.exit, Some(0));
    // No stdin: the child sees EOF at once instead of hanging.
    let r = gw.exec(&["cat"]).await;
    assert_eq!((r.out(), r.exit), (String::new(), Some(0)), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_and_workdir_with_awkward_quoting() {
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let odd_dir = sup.workdir.join("dir with 'quotes' and $x");
    std::fs::create_dir(&odd_dir).unwrap();
    std::fs::set_permissions(
        &odd_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut req = gw.request(&["sh", "-c", "printf '%s|%s|%s|' \"$A\" \"$B\" \"$C\"; pwd"]);
    req.environment
        .insert("A".into(), "it's \"quoted\" $HOME `x`".into());
    req.environment.insert("B".into(), "".into());
    req.environment
        .insert("C".into(), "semi;colon && pipe|".into());
    req.workdir = odd_dir.display().to_string();
    let r = exec_collect(gw.state.clone(), req).await;
    assert_eq!(
        r.out(),
        format!(
            "it's \"quoted\" $HOME `x`||semi;colon && pipe||{}\n",
            odd_dir.display()
        ),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_env_is_clean_and_cwd_is_the_workdir() {
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let r = gw.sh("env; echo cwd=$(pwd)").await;
    let out = r.out();
    assert!(out.contains("OPENSHELL_SANDBOX=1"), "{out}");
    assert!(
        out.contains(&format!("cwd={}", sup.workdir.display())),
        "{out}"
    );
    for secret in [
        "OPENSHELL_SANDBOX_TOKEN",
        "OPENSHELL_TLS",
        "OPENSHELL_ENDPOINT",
        "OPENSHELL_SANDBOX_ID",
    ] {
        assert!(
            !out.contains(secret),
            "{secret} leaked into the child env:\n{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_are_not_readable_by_execs() {
    if !require(
        is_root(),
        "Landlock denial of the TLS key needs the full sandbox (root)",
    ) {
        return;
    }
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let key = gw.client.key.display().to_string();
    let r = gw.exec(&["cat", &key]).await;
    assert_ne!(r.exit, Some(0), "{r:?}");
    // The key lies outside every grant, so it does not even exist in the exec's view (whose
    // root holds only the granted paths; below /tmp it is the sandbox's private tmpfs).
    assert!(r.err().contains("No such file or directory"), "{r:?}");
    assert!(!r.out().contains("PRIVATE KEY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_of_256_mib_arrives_intact() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    // Deterministic, non-repeating-looking bytes: a counter through sha-like mixing is
    // overkill; `head -c` of a seeded generator from the shell would need tools. Use a
    // repeating 1 MiB pattern with a per-MiB index so reordering is detected.
    let script = "i=0; while [ $i -lt 256 ]; do head -c 1048560 /dev/zero | tr '\\0' x; printf '%016d' $i; i=$((i+1)); done";
    let mut hasher = Sha256::new();
    let mut total = 0usize;
    let code = exec_each(gw.state.clone(), gw.request(&["sh", "-c", script]), |p| {
        if let openshell_sandbox::proto::v1::exec_sandbox_event::Payload::Stdout(d) = p {
            hasher.update(&d.data);
            total += d.data.len();
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    assert_eq!(total, 256 << 20);
    let mut want = Sha256::new();
    for i in 0..256 {
        want.update(vec![b'x'; 1048560]);
        want.update(format!("{i:016}"));
    }
    assert_eq!(hasher.finalize(), want.finalize());
    // Data frames from the supervisor are at most 16 KiB, and output this large
    // fills them.
    let largest = gateway::LARGEST_FRAME.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(largest, 16 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_execs() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..32 {
        let st = gw.state.clone();
        let req = gw.request(&[
            "sh",
            "-c",
            &format!("sleep 0.2; echo {i}; echo e{i} >&2; exit {}", i % 5),
        ]);
        set.spawn(async move { (i, exec_collect(st, req).await) });
    }
    let mut seen = 0;
    while let Some(r) = set.join_next().await {
        let (i, r) = r.unwrap();
        assert_eq!(r.out(), format!("{i}\n"), "{r:?}");
        assert_eq!(r.err(), format!("e{i}\n"), "{r:?}");
        assert_eq!(r.exit, Some(i % 5));
        seen += 1;
    }
    assert_eq!(seen, 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tty_exec_gets_a_terminal() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let mut req = gw.request(&[
        "sh",
        "-c",
        "test -t 0 && test -t 1 && echo tty=yes; stty size; echo $TERM; echo err >&2",
    ]);
    req.tty = true;
    let r = exec_collect(gw.state.clone(), req).await;
    let out = r.out();
    assert!(out.contains("tty=yes"), "{r:?}");
    // The gateway asks for 0x0; the server bumps it to 1x1.
    assert!(out.contains("1 1"), "{r:?}");
    assert!(out.contains("xterm-256color"), "{r:?}");
    // A tty merges stderr into the one stream.
    assert!(out.contains("err"), "{r:?}");
    assert!(r.stderr.is_empty());
    assert_eq!(r.exit, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_remote_tree() {
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let marker = sup.workdir.join("pids");
    // Pids inside the exec are its own PID namespace's: every process of the tree carries a
    // unique mark in its argv, and is looked for by that mark in our /proc.
    let mark = format!("{}", 9_000_000 + std::process::id());
    let script = format!(
        "sleep 300.{mark} & echo $! > {m}; sh -c 'sleep 301.{mark}' & echo $! >> {m}; echo $$ >> {m}; wait",
        m = marker.display()
    );
    let mut req = gw.request(&["sh", "-c", &script]);
    req.timeout_seconds = 1;
    let r = exec_collect(gw.state.clone(), req).await;
    assert_eq!(r.exit, Some(124), "{r:?}");
    let pids = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(pids.lines().count(), 3, "the tree did not start: {pids}");
    // The gateway only drops the connection; the supervisor must kill the whole tree.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let alive = procs_with(&mark);
        if alive.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still alive: {alive:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Live (not zombie) processes whose argv contains `mark`.
fn procs_with(mark: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let hit = String::from_utf8_lossy(&cmd).contains(mark);
            (pid != me && hit && !stat.contains(") Z ")).then_some(pid)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_login_shell_env_and_login_default() {
    if !require(
        std::path::Path::new("/bin/bash").exists()
            || std::path::Path::new("/usr/bin/bash").exists(),
        "bash is needed to tell a login shell from a plain one",
    ) {
        return;
    }
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    // The command string runs in the outer shell itself, so `shopt` sees its login state.
    let r = gw.exec(&["shopt", "-q", "login_shell"]).await;
    assert_eq!(
        r.exit,
        Some(0),
        "default should be a bash login shell: {r:?}"
    );
    let mut req = gw.request(&["shopt", "-q", "login_shell"]);
    req.no_login_shell = true;
    let r = exec_collect(gw.state.clone(), req).await;
    assert_eq!(
        r.exit,
        Some(1),
        "OPENSHELL_NO_LOGIN_SHELL=1 should give a non-login shell: {r:?}"
    );
}

#[test]
fn test_gateway_quoting_matches_openshells_example() {
    use support::exec::{build_command, shell_escape};
    let mut req = openshell_sandbox::proto::v1::ExecSandboxRequest {
        sandbox_id: "s".into(),
        command: vec!["sh".into(), "-c".into(), "echo $HOME".into()],
        workdir: "/w d".into(),
        ..Default::default()
    };
    req.environment.insert("B".into(), "x y".into());
    req.environment.insert("A".into(), "1".into());
    assert_eq!(
        build_command(&req).unwrap(),
        "cd '/w d' && A=1 B='x y' sh -c 'echo $HOME'"
    );
    assert_eq!(shell_escape("it's").unwrap(), "'it'\"'\"'s'");
    assert_eq!(shell_escape("").unwrap(), "''");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_exec_survives_ssh_keepalives() {
    use russh::ChannelMsg;
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let relay = gw
        .state
        .open_relay(Some(openshell_sandbox::proto::v1::relay_open::Target::Ssh(
            openshell_sandbox::proto::v1::SshRelayTarget {},
        )))
        .await
        .unwrap();
    // The gateway's keepalive, sped up: one every second, dropped after 2 unanswered.
    let cfg = std::sync::Arc::new(russh::client::Config {
        keepalive_interval: Some(std::time::Duration::from_secs(1)),
        keepalive_max: 2,
        ..Default::default()
    });
    let mut h =
        russh::client::connect_stream(cfg, support::gateway::bridge(relay), support::exec::AnyKey)
            .await
            .unwrap();
    assert!(h.authenticate_none("sandbox").await.unwrap().success());
    let mut ch = h.channel_open_session().await.unwrap();
    ch.exec(true, &b"sleep 5; echo awake"[..]).await.unwrap();
    ch.eof().await.unwrap();
    let (mut out, mut code) = (Vec::new(), None);
    while let Some(m) = ch.wait().await {
        match m {
            ChannelMsg::Data { data } => out.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    assert_eq!((out, code), (b"awake\n".to_vec(), Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_process_does_not_hold_the_exec_open() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    // `sleep` inherits stdout; the exec still ends when its shell does, and the sleep is gone.
    // (Its pid inside is its PID namespace's: find it by a unique argv instead.)
    let mark = format!("{}", 8_000_000 + std::process::id());
    let r = gw.sh(&format!("sleep 300.{mark} & echo started")).await;
    assert_eq!(
        (r.out(), r.exit),
        ("started\n".to_string(), Some(0)),
        "{r:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Gone, or a zombie about to be reaped.
    while !procs_with(&format!("sleep\0300.{mark}")).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "background sleep survived its exec"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_shell_on_a_pty() {
    use russh::ChannelMsg;
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let relay = gw
        .state
        .open_relay(Some(openshell_sandbox::proto::v1::relay_open::Target::Ssh(
            openshell_sandbox::proto::v1::SshRelayTarget {},
        )))
        .await
        .unwrap();
    let h = support::exec::ssh_connect(support::gateway::bridge(relay))
        .await
        .unwrap();
    let mut ch = h.channel_open_session().await.unwrap();
    ch.request_pty(false, "xterm", 80, 24, 0, 0, &[])
        .await
        .unwrap();
    ch.request_shell(true).await.unwrap();
    ch.window_change(100, 30, 0, 0).await.unwrap();
    ch.data(&b"stty size; echo marker-$((6*7)); exit 3\n"[..])
        .await
        .unwrap();
    let (mut out, mut code) = (Vec::new(), None);
    while let Some(m) = ch.wait().await {
        match m {
            ChannelMsg::Data { data } => out.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("marker-42"), "{out}");
    assert!(
        out.contains("30 100"),
        "window-change should resize the pty: {out}"
    );
    assert_eq!(code, Some(3), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_stays_responsive_while_an_exec_misbehaves() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state
        .heartbeat_secs
        .store(5, std::sync::atomic::Ordering::SeqCst);
    let mut sup = Supervisor::start(&gw, SupOpts::default());
    gw.wait_ready(&mut sup).await;
    // A CPU spin on every core plus a flood of output nobody reads quickly.
    let st = gw.state.clone();
    let mut hog = gw.request(&[
        "sh",
        "-c",
        "yes >/dev/null & yes >/dev/null & head -c 300000000 /dev/zero",
    ]);
    hog.timeout_seconds = 14;
    let bad = tokio::spawn(async move {
        let mut rx = support::exec::exec_stream(st, hog).await.unwrap();
        while let Some(ev) = rx.recv().await {
            if ev.is_err() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    // Other execs are still served meanwhile.
    for i in 0..3 {
        let r = gw.sh(&format!("echo meanwhile {i}")).await;
        assert_eq!(r.out(), format!("meanwhile {i}\n"), "{r:?}");
    }
    bad.await.unwrap();
    let hb = gw.state.seen().heartbeats;
    assert!(hb.len() >= 2, "heartbeats: {}", hb.len());
    for w in hb.windows(2) {
        // Liveness, not speed: a gap over twice the interval means the loop was starved.
        assert!(
            w[1] - w[0] < std::time::Duration::from_secs(10),
            "heartbeat gap {:?}",
            w[1] - w[0]
        );
    }
    assert!(sup.try_status().is_none());
}
