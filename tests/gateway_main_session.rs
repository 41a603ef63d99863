//! The canonical main process on a terminal and the `openshell-main` subsystem
//!, through the real binary: the default `/bin/bash -l` tty main
//! process that `openshell sandbox create` asks for stays alive with nobody attached; OpenSSH
//! attaches as `openshell sandbox connect` does (replay, window-change, detach and re-attach,
//! a read-only second attacher, keepalives); russh attachers send signals, stall, and flood.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use russh::Sig;
use support::connect::{Attacher, ProxyListener, Terminal};
use support::*;
use tokio::io::AsyncWriteExt;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_secs(20);
/// The size of one client write in the flood test.
const CHUNK: usize = 4096;

fn spec(command: &[&str], tty: bool) -> (String, String) {
    let v = serde_json::json!({ "version": 1, "command": command, "tty": tty });
    ("OPENSHELL_MAIN_PROCESS_SPEC".into(), v.to_string())
}

/// What the K8s driver writes for `openshell sandbox create` with no command.
fn default_spec() -> (String, String) {
    spec(&["/bin/bash", "-l"], true)
}

async fn start(env: (String, String)) -> (TestGateway, Supervisor) {
    up(
        AuthMode::Jwt,
        SupOpts {
            env: vec![env],
            ..Default::default()
        },
    )
    .await
}

fn have(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn require_openssh() -> bool {
    require(
        have("ssh") && have("busybox"),
        "OpenSSH's `ssh` (apt-get install openssh-client) and `busybox` (its nc is the ProxyCommand)",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_tty_main_process_lives_unattached_for_30s_then_every_attacher_gets_its_exit() {
    let (gw, mut sup) = start(default_spec()).await;
    // Before the fix bash ran with stdin closed and no terminal, so it exited at once and the
    // gateway marked the sandbox ERROR.
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        assert!(
            sup.try_status().is_none(),
            "the main process ended with nobody attached:\n{}",
            sup.log()
        );
        assert!(gw.state.seen().reports.is_empty(), "{}", sup.log());
        assert!(gw.state.is_ready(), "{}", sup.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut owner = Attacher::attach(&gw.state, Some((80, 24)), false)
        .await
        .unwrap();
    let mut reader = Attacher::attach(&gw.state, None, true).await.unwrap();
    // It runs on a terminal of its own, and only the owner's keystrokes reach it.
    reader.send(b"echo READER$((1+1))\r").await;
    owner.send(b"tty; echo OWNER$((2+3))\r").await;
    owner.wait_out("OWNER5", SHORT).await;
    reader.wait_out("OWNER5", SHORT).await;
    assert!(owner.out().contains("/dev/pts/"), "{}", owner.out());
    assert!(!reader.out().contains("READER2"), "{}", reader.out());
    assert!(reader.err().is_empty(), "{}", reader.err());

    owner.send(b"exit 7\r").await;
    for a in [&mut owner, &mut reader] {
        a.wait_closed(SHORT).await;
        assert!(a.eof, "no eof before close");
        assert_eq!(a.exit, Some(7), "{}", a.out());
    }
    let status = sup.wait_exit(LONG).await;
    assert_eq!(status.code(), Some(7), "{}", sup.log());
    assert_eq!(gw.state.seen().reports[0].exit_code, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssh_connect_resizes_detaches_reattaches_and_attaches_read_only() {
    if !require_openssh() {
        return;
    }
    let (gw, mut sup) = start(default_spec()).await;
    let proxy = ProxyListener::start(gw.state.clone()).await;
    // Keepalives every second, two unanswered ones end the connection: the idle pause below
    // shows they are answered.
    let fast_alive = ["-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=2"];
    let mut first = Terminal::spawn(proxy.ssh(&fast_alive), 120, 40);
    // The pty-req size was applied to the main pty.
    first.type_bytes(b"stty size; echo M$((6*7))K\r");
    first.wait_for("M42K", SHORT).await;
    assert!(first.output().contains("40 120"), "{}", first.output());
    // SIGWINCH on ssh's terminal becomes window-change, which resizes the main pty.
    first.resize(100, 37);
    let deadline = Instant::now() + SHORT;
    while !first.output().contains("37 100") {
        assert!(
            Instant::now() < deadline,
            "no window-change:\n{}",
            first.output()
        );
        first.type_bytes(b"stty size\r");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        first.running(),
        "keepalives unanswered:\n{}",
        first.output()
    );

    // A second attacher is read-only, told so, and first gets the retained output.
    let mut second = Terminal::spawn(proxy.ssh(&[]), 100, 37);
    second
        .wait_for(
            "openshell: canonical main process already has an input owner; attached read-only",
            SHORT,
        )
        .await;
    second.wait_for("M42K", SHORT).await;
    second.type_bytes(b"echo RO$((3+3))\r");
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.type_bytes(b"echo OWN$((4+4))\r");
    first.wait_for("OWN8", SHORT).await;
    second.wait_for("OWN8", SHORT).await;

    // Ctrl-P Ctrl-Q, split across two writes: ssh ends with status 0, the process lives on.
    first.type_bytes(b"\x10");
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.type_bytes(b"\x11");
    let status = first.wait_exit(SHORT).await;
    assert_eq!(status.code(), Some(0), "{}", first.output());
    assert!(sup.try_status().is_none(), "{}", sup.log());
    // The lease is free, but the read-only attacher is not promoted.
    second.type_bytes(b"echo PROMO$((5+5))\r");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Re-attach: the replay holds what came before, and input works again.
    let mut third = Terminal::spawn(proxy.ssh(&[]), 100, 37);
    third.wait_for("OWN8", SHORT).await;
    third.type_bytes(b"echo BACK$((6+6))\r");
    third.wait_for("BACK12", SHORT).await;
    second.wait_for("BACK12", SHORT).await;
    for t in [&first, &second, &third] {
        let o = t.output();
        assert!(!o.contains("RO6") && !o.contains("PROMO10"), "{o}");
    }
    assert!(
        !third.output().contains("attached read-only"),
        "{}",
        third.output()
    );

    // The end of the main process ends every attachment with its status.
    third.type_bytes(b"exit 3\r");
    assert_eq!(third.wait_exit(SHORT).await.code(), Some(3));
    assert_eq!(second.wait_exit(SHORT).await.code(), Some(3));
    assert_eq!(sup.wait_exit(LONG).await.code(), Some(3), "{}", sup.log());
    assert!(proxy.errors.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_main_process_group_and_pipes_keep_stderr_apart() {
    // The inner shell runs in the foreground, in the leader's process group: only a signal
    // to the group reaches both.
    let script = "echo to-err >&2; echo OUT$((40+2)); trap 'echo INT-leader' INT; \
        sh -c 'trap \"echo INT-child; exit 3\" INT; echo child-ready; while :; do sleep 0.1; done'; \
        echo child-ended-$?; while :; do sleep 0.1; done";
    let (gw, mut sup) = start(spec(&["sh", "-c", script], false)).await;
    let mut a = Attacher::attach(&gw.state, None, false).await.unwrap();
    a.wait_out("child-ready", SHORT).await;
    assert!(a.out().contains("OUT42") && !a.out().contains("to-err"));
    assert!(
        a.read_until(SHORT, |a| a.err().contains("to-err")).await,
        "{}",
        a.err()
    );
    // Its output goes to the retained log only, not to the supervisor's stdout.
    assert!(!sup.log().contains("OUT42"), "{}", sup.log());

    // SIGUSR1 is not one of the five: ignored (its default action would kill the shells).
    a.ch.signal(Sig::USR1).await.unwrap();
    a.ch.signal(Sig::INT).await.unwrap();
    // The leader's trap runs once its foreground child has ended, then it goes on.
    a.wait_out("INT-leader", SHORT).await;
    a.wait_out("child-ended-", SHORT).await;
    assert!(a.out().contains("INT-child"), "{}", a.out());
    assert!(a.out().contains("child-ended-3"), "{}", a.out());

    a.ch.signal(Sig::KILL).await.unwrap();
    a.wait_closed(SHORT).await;
    assert_eq!(a.exit, Some(128 + 9));
    assert_eq!(sup.wait_exit(LONG).await.code(), Some(137), "{}", sup.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_eof_releases_the_lease_and_output_keeps_flowing() {
    let (gw, _sup) = start(spec(&["/bin/sh"], true)).await;
    let mut a = Attacher::attach(&gw.state, Some((80, 24)), false)
        .await
        .unwrap();
    a.send(b"echo A$((1+1))\r").await;
    a.wait_out("A2", SHORT).await;
    a.ch.eof().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut b = Attacher::attach(&gw.state, Some((80, 24)), false)
        .await
        .unwrap();
    b.send(b"echo B$((2+2))\r").await;
    b.wait_out("B4", SHORT).await;
    assert!(!b.err().contains("read-only"), "{}", b.err());
    // The eof'd attacher still gets live output, and its stdin was never closed.
    a.wait_out("B4", SHORT).await;
    assert!(!a.closed && a.exit.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_attacher_is_told_it_fell_behind_and_closed_without_exit_status() {
    let script = "read go; head -c 16000000 /dev/zero; touch burst-done; exec sleep 1000";
    let (gw, mut sup) = start(spec(&["sh", "-c", script], false)).await;
    let mut a = Attacher::attach(&gw.state, None, false).await.unwrap();
    a.send(b"go\n").await;
    // Not reading: russh's bounded channel queue fills and the server's writes stall.
    let marker = sup.workdir.join("burst-done");
    let deadline = Instant::now() + LONG;
    while !marker.exists() {
        assert!(Instant::now() < deadline, "no burst:\n{}", sup.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.wait_closed(LONG).await;
    let err = a.err();
    let n: u64 = err
        .strip_prefix("openshell: attachment fell behind by ")
        .and_then(|r| r.strip_suffix(" output chunks; reconnect for buffered output\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("stderr {err:?}"));
    assert!(n > 0);
    assert_eq!(a.exit, None, "fell behind is not an exit");
    assert!(sup.try_status().is_none(), "{}", sup.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stdin_queue_closes_the_attachment_with_status_0() {
    // It never reads stdin: the pipe fills, then the 64-write queue.
    let (gw, mut sup) = start(spec(&["sleep", "1000"], false)).await;
    let mut a = Attacher::attach(&gw.state, None, false).await.unwrap();
    // The client writes while it reads. Once the supervisor closes the attachment it grants no
    // more window, and russh's `data` waits for window even on a closed channel: a writer
    // that must finish before anyone reads never sees the close (this test hung that way once
    // the window was cut to 128 KiB, below the bytes written here).
    const CHUNKS: usize = 200;
    let sent = Arc::new(AtomicUsize::new(0));
    let writer = {
        let mut w = a.ch.make_writer();
        let sent = sent.clone();
        tokio::spawn(async move {
            let chunk = vec![b'x'; CHUNK];
            for _ in 0..CHUNKS {
                if w.write_all(&chunk).await.is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    a.wait_closed(SHORT).await;
    assert_eq!(
        a.err(),
        "openshell: canonical stdin buffer is full; closing attachment\n"
    );
    assert!(a.eof);
    assert_eq!(a.exit, Some(0));
    // Cut off by the full queue, not by the window: the client was still writing, and the
    // supervisor had taken at least the 64 queued writes of one chunk each.
    assert!(!writer.is_finished(), "the client finished writing first");
    writer.abort();
    let sent = sent.load(Ordering::SeqCst);
    assert!((64..CHUNKS).contains(&sent), "{sent} chunks written");
    assert!(sup.try_status().is_none(), "{}", sup.log());
    // The lease went with the attachment, and the queue is still full (nothing reads it): the
    // next attacher owns input (a read-only one's keystrokes would be dropped silently), so
    // its first write gets the same answer.
    let mut b = Attacher::attach(&gw.state, None, false).await.unwrap();
    b.send(b"more").await;
    b.wait_closed(SHORT).await;
    assert_eq!(
        b.err(),
        "openshell: canonical stdin buffer is full; closing attachment\n"
    );
    assert_eq!(b.exit, Some(0));
    assert!(sup.try_status().is_none(), "{}", sup.log());
}

/// An image without bash, made from this host's root in a private mount namespace: `/bin/bash`
/// (`/usr/bin/bash` on a usr-merged host) is covered by `/dev/null`, which is no executable.
async fn start_without_bash(shell: Option<&str>) -> (TestGateway, Supervisor) {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    let mut env = vec![default_spec()];
    if let Some(s) = shell {
        env.push(("SHELL".into(), s.into()));
    }
    let hide = "for b in /bin/bash /usr/bin/bash; do [ -e $b ] && mount --bind /dev/null $b; done; \
        [ ! -f /bin/bash ] && exec \"$0\" \"$@\"";
    let opts = SupOpts {
        env,
        wrapper: ["unshare", "-m", "sh", "-c", hide]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let mut sup = Supervisor::start(&gw, opts);
    gw.wait_ready(&mut sup).await;
    (gw, sup)
}

/// What the default main process is running, asked on its own terminal.
async fn default_shell_of(gw: &TestGateway) -> String {
    let mut a = Attacher::attach(&gw.state, Some((80, 24)), false)
        .await
        .unwrap();
    a.send(b"echo \"SHELL0=$0 ${BASH_VERSION:-nobash} $(tty)\"\r")
        .await;
    a.wait_out("nobash /dev/pts/", SHORT).await;
    let out = a.out();
    // The typed line is echoed too; only the answer has an expanded `$0`.
    let at = out.find("SHELL0=/").unwrap_or_else(|| panic!("{out}"));
    out[at..].split_whitespace().next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bash_the_default_main_process_is_shell_then_sh_on_a_tty() {
    if !require(
        is_root() && have("unshare"),
        "root and unshare(1) (a private mount namespace hides /bin/bash)",
    ) {
        return;
    }
    let dash = ["/usr/bin/dash", "/bin/dash"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    if !require(dash.is_some(), "dash, as $SHELL") {
        return;
    }
    let (gw, mut sup) = start_without_bash(dash).await;
    assert_eq!(
        default_shell_of(&gw).await,
        format!("SHELL0={}", dash.unwrap())
    );
    assert!(sup.try_status().is_none(), "{}", sup.log());

    let (gw, mut sup) = start_without_bash(None).await;
    assert_eq!(default_shell_of(&gw).await, "SHELL0=/bin/sh");
    assert!(sup.try_status().is_none(), "{}", sup.log());
}

/// A pty main process is hung up first at shutdown, so `sleep` on a terminal ends by SIGHUP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_supervisor_ends_every_attachment_with_the_main_process_status() {
    let (gw, mut sup) = start(spec(&["sleep", "1000"], true)).await;
    let mut a = Attacher::attach(&gw.state, Some((80, 24)), false)
        .await
        .unwrap();
    let mut b = Attacher::attach(&gw.state, None, true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    sup.signal(libc::SIGTERM);
    for x in [&mut a, &mut b] {
        x.wait_closed(SHORT).await;
        assert!(x.eof);
        assert_eq!(x.exit, Some(128 + libc::SIGHUP as u32), "{}", sup.log());
    }
    assert_eq!(sup.wait_exit(LONG).await.code(), Some(0), "{}", sup.log());
    assert_eq!(gw.state.seen().reports[0].exit_code, 128 + libc::SIGHUP);
}

/// The shutdown grace these tests give, long enough that sitting it out would be plain.
const GRACE: &str = "30";

/// Start a supervisor whose main process is `env`'s, with a long shutdown grace.
async fn start_with_grace(env: (String, String)) -> (TestGateway, Supervisor) {
    up(
        AuthMode::Jwt,
        SupOpts {
            env: vec![env],
            args: vec!["--shutdown-grace".into(), GRACE.into()],
            ..Default::default()
        },
    )
    .await
}

/// Deleting a sandbox whose main process is an interactive shell: bash on a terminal ignores
/// SIGTERM, so before it sat out the whole grace and was killed (137). It is hung up first now,
/// as a terminal hang-up would, and ends at once by SIGHUP (129).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_shell_main_process_is_hung_up_and_stops_promptly() {
    let (gw, mut sup) = start_with_grace(default_spec()).await;
    let mut a = Attacher::attach(&gw.state, Some((80, 24)), false)
        .await
        .unwrap();
    // An interactive bash (`i` in `$-`), with its signal dispositions in place.
    a.send(b"echo \"MODE=${-//[^i]/}X\"\r").await;
    a.wait_out("MODE=iX", SHORT).await;
    let t = Instant::now();
    sup.signal(libc::SIGTERM);
    let status = sup.wait_exit(LONG).await;
    let took = t.elapsed();
    eprintln!("SIGTERM to supervisor exit: {took:?}");
    assert_eq!(status.code(), Some(0), "{}", sup.log());
    assert_eq!(
        gw.state.seen().reports[0].exit_code,
        128 + libc::SIGHUP,
        "{}",
        sup.log()
    );
    a.wait_closed(SHORT).await;
    assert_eq!(a.exit, Some(128 + libc::SIGHUP as u32));
    // Not a timing claim, only far from the 30 s grace a SIGTERM-only stop sits out.
    assert!(took < Duration::from_secs(15), "the stop took {took:?}");
}

/// Which signal reaches the main process first at shutdown: a script that exits 71 on SIGHUP
/// and 72 on SIGTERM. On a terminal SIGHUP comes first; on pipes SIGTERM, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_shutdown_signal_is_sighup_on_a_pty_and_sigterm_on_pipes() {
    let script = "trap 'exit 71' HUP; trap 'exit 72' TERM; touch started; \
                  while :; do sleep 0.1; done";
    for (tty, want) in [(true, 71), (false, 72)] {
        let (gw, mut sup) = start_with_grace(spec(&["sh", "-c", script], tty)).await;
        let marker = sup.workdir.join("started");
        let deadline = Instant::now() + LONG;
        while !marker.exists() {
            assert!(Instant::now() < deadline, "never started:\n{}", sup.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        sup.signal(libc::SIGTERM);
        assert_eq!(sup.wait_exit(LONG).await.code(), Some(0), "{}", sup.log());
        assert_eq!(
            gw.state.seen().reports[0].exit_code,
            want,
            "tty {tty}: {}",
            sup.log()
        );
    }
}
