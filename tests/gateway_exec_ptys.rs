//! Hostile code inside one `serve` exec against what it shares a uid with: the terminal of
//! another exec of the same sandbox. The execs of a sandbox share a uid and a view by design;
//! a pty allocated for one of them must still be out of reach of the others, or a command
//! could read what the user types into another session (or type into it).

mod support;

use std::time::{Duration, Instant};

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_execs_pty_cannot_be_opened() {
    if !require(
        is_root(),
        "root: the sandbox uid differs from the supervisor's",
    ) {
        return;
    }
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let name = sup.workdir.join("ttyname");
    let mut req = gw.request(&[
        "sh",
        "-c",
        &format!("tty > {}.tmp && mv {0}.tmp {0}; sleep 20", path_str(&name)),
    ]);
    req.tty = true;
    let st = gw.state.clone();
    let victim = tokio::spawn(async move { exec_collect(st, req).await });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !name.exists() {
        assert!(
            Instant::now() < deadline,
            "the pty exec never wrote its tty name"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tty = std::fs::read_to_string(&name).unwrap().trim().to_string();
    assert!(tty.starts_with("/dev/pts/"), "{tty:?}");
    // Read (steal input) and write (inject output), each its own open. Both are refused twice
    // over: the slave is root's, mode 0600 (the supervisor opened it), and /dev/pts is in no
    // Landlock grant.
    let r = gw
        .sh(&format!(
            "head -c1 {tty}; echo read=$?; (echo injected > {tty}) 2>&1; echo write=$?"
        ))
        .await;
    assert!(r.out().contains("read=1"), "{r:?}");
    // The shell's own failed redirection: exit 2 (POSIX sh).
    assert!(r.out().contains("write=2"), "{r:?}");
    assert_eq!(
        r.out().matches("Permission denied").count() + r.err().matches("Permission denied").count(),
        2,
        "{r:?}\nout: {}\nerr: {}",
        r.out(),
        r.err()
    );
    victim.abort();
}
