//! Hardening of `serve`, each through the real binary against the test gateway.

mod support;

use std::time::{Duration, Instant};

use openshell_sandbox::proto::v1::*;
use russh::ChannelMsg;
use support::exec::{AnyKey, ssh_connect};
use support::gateway::bridge;
use support::*;

const LONG: Duration = Duration::from_secs(60);

fn ssh_target() -> Option<relay_open::Target> {
    Some(relay_open::Target::Ssh(SshRelayTarget {}))
}

async fn raw_ssh(gw: &TestGateway) -> russh::client::Handle<AnyKey> {
    let relay = gw.state.open_relay(ssh_target()).await.unwrap();
    ssh_connect(bridge(relay)).await.unwrap()
}

/// Run `cmd` on an already open channel; returns (stdout, stderr, exit-status).
async fn collect(mut ch: russh::Channel<russh::client::Msg>) -> (String, String, Option<u32>) {
    let (mut out, mut err, mut code) = (Vec::new(), Vec::new(), None);
    while let Some(m) = ch.wait().await {
        match m {
            ChannelMsg::Data { data } => out.extend_from_slice(&data),
            ChannelMsg::ExtendedData { data, .. } => err.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
        code,
    )
}

async fn exec_on(h: &russh::client::Handle<AnyKey>, cmd: &str) -> (String, String, Option<u32>) {
    let ch = h.channel_open_session().await.unwrap();
    ch.exec(true, cmd.as_bytes().to_vec()).await.unwrap();
    ch.eof().await.unwrap();
    collect(ch).await
}

/// Stdin is queued at most 1 MiB per channel; beyond that the channel is
/// not read, so a child that does not read its stdin cannot make the supervisor (PID 1 of the
/// pod, outside every exec's limits) buffer what the gateway sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_to_a_sleeping_exec_keeps_supervisor_rss_bounded() {
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    assert_eq!(gw.sh("echo warm").await.exit, Some(0));
    let baseline = sup.rss_kib();
    const TOTAL: usize = 192 << 20;
    // The child reads nothing for 4 s, then counts every byte: backpressure, not loss.
    let mut req = gw.request(&["sh", "-c", "sleep 4; wc -c"]);
    req.stdin = vec![b'x'; TOTAL];
    let pid = sup.pid();
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(4) {
            peak = peak.max(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        peak
    });
    let r = exec_collect(gw.state.clone(), req).await;
    let peak = sampler.await.unwrap();
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "supervisor RSS: baseline {baseline} KiB, peak while asleep {peak} KiB, growth {growth} KiB"
    );
    assert_eq!(
        (r.out().trim(), r.exit),
        (TOTAL.to_string().as_str(), Some(0)),
        "{r:?}\n{}",
        sup.log()
    );
    assert!(
        growth < 8 * 1024,
        "RSS grew by {growth} KiB while 192 MiB of stdin waited for a sleeping exec"
    );
}

/// A session channel that streams data and never sends a request is closed
/// after the request timeout (30 s by default; shortened here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_without_a_request_is_closed() {
    let (gw, mut sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--channel-request-timeout-ms".into(), "1000".into()],
            ..Default::default()
        },
    )
    .await;
    let h = raw_ssh(&gw).await;
    let ch = h.channel_open_session().await.unwrap();
    let (mut rd, wr) = ch.split();
    let t0 = Instant::now();
    let closed = loop {
        tokio::select! {
            m = rd.wait() => match m {
                None | Some(ChannelMsg::Close) => break true,
                Some(_) => {}
            },
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                if t0.elapsed() > Duration::from_secs(10) {
                    break false;
                }
                // Data, but never a request.
                let _ = wr.data(&b"data without a request\n"[..]).await;
            }
        }
    };
    assert!(
        closed,
        "the requestless channel was never closed:\n{}",
        sup.log()
    );
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "closed too early: {waited:?}"
    );
    sup.wait_log("sent no exec, shell or subsystem request", LONG)
        .await;
    // The connection itself still serves execs.
    let (out, _, code) = exec_on(&h, "echo still").await;
    assert_eq!((out.as_str(), code), ("still\n", Some(0)));
}

/// `--max-execs` counts execs, not relays: one relay carrying two session
/// channels under `--max-execs 1` gets the second refused, and the permit comes back when
/// the first exec ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_execs_counts_session_channels_on_one_relay() {
    let (gw, mut sup) = up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--max-execs".into(), "1".into()],
            ..Default::default()
        },
    )
    .await;
    let h = raw_ssh(&gw).await;
    let first = h.channel_open_session().await.unwrap();
    first
        .exec(true, b"echo started; exec sleep 60".to_vec())
        .await
        .unwrap();
    let (mut first_rd, first_wr) = first.split();
    // Wait until the first exec runs, so it certainly holds the permit.
    loop {
        match tokio::time::timeout(LONG, first_rd.wait()).await.unwrap() {
            Some(ChannelMsg::Data { data }) if data.starts_with(b"started") => break,
            Some(ChannelMsg::Close) | None => panic!("first exec ended:\n{}", sup.log()),
            _ => {}
        }
    }
    let (out, err, code) = exec_on(&h, "echo second").await;
    assert_eq!(out, "", "the second exec ran: {err}");
    assert!(
        err.contains("too many concurrent execs") && err.contains("--max-execs"),
        "{err:?}"
    );
    assert_eq!(code, Some(2), "{err}");
    sup.wait_log("too many concurrent execs", LONG).await;
    // Closing the first channel kills its exec and frees the permit.
    first_wr.close().await.unwrap();
    let deadline = Instant::now() + LONG;
    loop {
        let (out, err, code) = exec_on(&h, "echo third").await;
        if code == Some(0) {
            assert_eq!(out, "third\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the permit never came back: {err}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After UNAUTHENTICATED the token file is read again, so a rotated file
/// recovers the session without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_file_is_read_again_after_unauthenticated() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let file = gw.dir.path().join("sandbox-token");
    // Signed by another issuer: the gateway answers UNAUTHENTICATED.
    let stranger = support::jwt::JwtIssuer::new();
    std::fs::write(&file, stranger.mint(SANDBOX_ID, 3600)).unwrap();
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            env: vec![
                ("OPENSHELL_SANDBOX_TOKEN".into(), String::new()),
                ("OPENSHELL_SANDBOX_TOKEN_FILE".into(), path_str(&file)),
            ],
            args: vec![
                "--reconnect-base-ms".into(),
                "100".into(),
                "--reconnect-max-ms".into(),
                "200".into(),
            ],
            ..Default::default()
        },
    );
    sup.wait_log("did not accept the bearer token", LONG).await;
    assert!(!gw.state.is_ready());
    std::fs::write(&file, gw.state.jwt.mint(SANDBOX_ID, 3600)).unwrap();
    gw.wait_ready(&mut sup).await;
    // The policy fetch failed on the same bad token, so execs are refused (quarantine) until
    // the plane's next poll, which comes within a second while quarantined.
    let end = std::time::Instant::now() + Duration::from_secs(15);
    let mut out = gw.sh("echo rotated").await.out();
    while out != "rotated\n" && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        out = gw.sh("echo rotated").await.out();
    }
    assert_eq!(out, "rotated\n", "{}", sup.log());
}

/// The Docker and Podman drivers set OPENSHELL_SANDBOX_UID="" and
/// OPENSHELL_SANDBOX_GID=""; an empty value means unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_uid_and_gid_env_mean_unset() {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut sup = Supervisor::start(
        &gw,
        SupOpts {
            empty_env: vec![
                "OPENSHELL_SANDBOX_UID".into(),
                "OPENSHELL_SANDBOX_GID".into(),
            ],
            ..Default::default()
        },
    );
    gw.wait_ready(&mut sup).await;
    let r = gw.sh("echo ok").await;
    assert_eq!(
        (r.out(), r.exit),
        ("ok\n".to_string(), Some(0)),
        "{}",
        sup.log()
    );
}

fn passwd_entry(name: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name)).then(|| (f[2].parse().unwrap(), f[3].parse().unwrap()))
    })
}

/// OPENSHELL_OCI_IMAGE_USER (the image's USER) gives the identity when the
/// driver leaves UID/GID empty, as names or numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_image_user_gives_the_identity() {
    if !require(
        is_root(),
        "root (the supervisor drops to the image's user only as root)",
    ) {
        return;
    }
    let mut cases = vec![
        ("4321:4322".to_string(), (4321, 4322)),
        ("4321".to_string(), (4321, 4321)),
    ];
    if let Some(ids) = passwd_entry("nobody") {
        cases.push(("nobody".into(), ids));
    }
    for (spec, (uid, gid)) in cases {
        let gw = TestGateway::start(AuthMode::Jwt).await;
        let mut sup = Supervisor::start(
            &gw,
            SupOpts {
                env: vec![("OPENSHELL_OCI_IMAGE_USER".into(), spec.clone())],
                empty_env: vec![
                    "OPENSHELL_SANDBOX_UID".into(),
                    "OPENSHELL_SANDBOX_GID".into(),
                ],
                ..Default::default()
            },
        );
        gw.wait_ready(&mut sup).await;
        let r = gw.sh("id -u; id -g").await;
        assert_eq!(
            (r.out(), r.exit),
            (format!("{uid}\n{gid}\n"), Some(0)),
            "OPENSHELL_OCI_IMAGE_USER={spec}: {}\n{}",
            r.err(),
            sup.log()
        );
    }
}

/// Run the binary with `args` and no gateway (`--no-gateway`); returns (exit code, stderr).
fn run_bin(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .args(["--no-gateway", "--workdir"])
        .arg(dir.path())
        .arg("--allow-degraded")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Only the combined topology is served; every other `--mode`, the post-HEAD
/// `--role` launch style and the unimplemented hidden subcommands are refused at start with
/// exit 125 and a message naming them, never run as a main command.
#[test]
fn unsupported_topologies_and_launch_styles_are_refused() {
    let cases: &[(&[&str], &str)] = &[
        (&["--mode=network"], "`network` topology"),
        (&["--mode", "network"], "`network` topology"),
        (&["--mode=process"], "`process` topology"),
        (&["--mode", "network-init"], "`network-init` topology"),
        (&["--mode=network,network-init"], "`network-init` topology"),
        (&["--mode=bogus"], "unknown mode `bogus`"),
        (&["--mode="], "empty mode"),
        (&["--role=isolation-backend"], "--role isolation-backend"),
        (&["--role", "isolation-backend"], "--role isolation-backend"),
    ];
    for (args, want) in cases {
        let (code, err) = run_bin(&[args, &["true"][..]].concat());
        assert_eq!(code, Some(125), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    for word in ["validate-workspace", "debug-rpc"] {
        let out = std::process::Command::new(BIN)
            .args([word, "--workdir", "/tmp"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{word}: {err}");
        assert!(
            err.contains(word) && err.contains("not implemented"),
            "{word}: {err}"
        );
    }
    // The combined topology, in any order and with spaces, is accepted.
    let (code, err) = run_bin(&["--mode", "process, network", "true"]);
    assert_eq!(code, Some(0), "{err}");
}

/// An SSH client that closes its connection when it is done (OpenSSH after a
/// refused subsystem, or after an exec) is a normal end, not a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_ssh_close_is_not_a_warning() {
    let (gw, mut sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let before = sup.log().len();
    {
        // An SSH client against a subsystem we do not serve (sftp now is): the request
        // fails and the client drops the connection without a disconnect message.
        let h = raw_ssh(&gw).await;
        let mut ch = h.channel_open_session().await.unwrap();
        ch.request_subsystem(true, "x-not-served").await.unwrap();
        loop {
            match tokio::time::timeout(LONG, ch.wait()).await.unwrap() {
                Some(ChannelMsg::Failure) => break,
                Some(ChannelMsg::Close) | None => break,
                _ => {}
            }
        }
    }
    {
        let h = raw_ssh(&gw).await;
        let (out, _, code) = exec_on(&h, "echo done").await;
        assert_eq!((out.as_str(), code), ("done\n", Some(0)));
    }
    // Both closes have been seen once a later exec completes and the logs settle.
    assert_eq!(gw.sh("echo later").await.exit, Some(0));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = sup.log();
    let tail = &log[before..];
    assert!(
        !tail.contains("WARN") && !tail.contains("early eof"),
        "a clean close was logged as a warning:\n{tail}"
    );
    assert!(sup.try_status().is_none());
}

/// The stdin bound must not deadlock a filter whose output comes back on the same connection
/// while its input is still arriving (an SSH client such as OpenSSH writes stdin and reads
/// output at the same time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_backpressure_keeps_a_filter_flowing() {
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    const TOTAL: usize = 24 << 20;
    let input: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
    let h = raw_ssh(&gw).await;
    let ch = h.channel_open_session().await.unwrap();
    ch.exec(true, b"cat".to_vec()).await.unwrap();
    let (mut rd, wr) = ch.split();
    let data = input.clone();
    let writer = tokio::spawn(async move {
        wr.data(&data[..]).await.unwrap();
        wr.eof().await.unwrap();
        wr
    });
    let read = async {
        let (mut out, mut code) = (Vec::new(), None);
        while let Some(m) = rd.wait().await {
            match m {
                ChannelMsg::Data { data } => out.extend_from_slice(&data),
                ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status),
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        (out, code)
    };
    let (out, code) = tokio::time::timeout(LONG, read)
        .await
        .unwrap_or_else(|_| panic!("cat stalled:\n{}", sup.log()));
    let _ = writer.await;
    assert_eq!(code, Some(0));
    assert!(
        out == input,
        "output differs ({} of {TOTAL} bytes)",
        out.len()
    );
}
