//! Where an exec has no PID namespace of its own (degraded, `--allow-degraded`), it sees the
//! supervisor and the other execs of its sandbox in /proc. The uid is shared with those execs
//! by design; what must still not cross: signals, their descriptors (stdin, a pty), their
//! environment, and the supervisor's (which holds the gateway token). Landlock's scopes and
//! ptrace rule hold these where the PID namespace is missing.

mod support;

use std::time::{Duration, Instant};

use support::require_pause_points;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_pid_namespace_another_exec_and_the_supervisor_stay_out_of_reach() {
    if !require(
        is_root(),
        "root (the identity switch and the view are root's)",
    ) || !require_pause_points()
    {
        return;
    }
    let opts = SupOpts {
        env: vec![("OSB_TEST_DENY_PIDNS".into(), "1".into())],
        args: vec!["--allow-degraded".into()],
        ..SupOpts::default()
    };
    let (gw, sup) = up(AuthMode::Jwt, opts).await;
    let pidfile = sup.workdir.join("victim.pid");
    let mut req = gw.request(&[
        "sh",
        "-c",
        &format!(
            "echo $$ > {0}.tmp && mv {0}.tmp {0}; exec sleep 30",
            path_str(&pidfile)
        ),
    ]);
    req.tty = true;
    let st = gw.state.clone();
    let victim = tokio::spawn(async move { exec_collect(st, req).await });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pidfile.exists() {
        assert!(Instant::now() < deadline, "the victim exec never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim_pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let sup_pid = sup.pid();
    let probe = format!(
        r#"
import errno, os, signal
def err(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
for name, pid in (('victim', {victim_pid}), ('supervisor', {sup_pid})):
    print(name, 'visible', os.path.exists('/proc/%d' % pid))
    print(name, 'kill0', err(lambda: os.kill(pid, 0)))
    print(name, 'sigterm', err(lambda: os.kill(pid, signal.SIGTERM)))
    print(name, 'fds', err(lambda: os.listdir('/proc/%d/fd' % pid)))
    print(name, 'stdin', err(lambda: os.close(os.open('/proc/%d/fd/0' % pid, os.O_RDONLY))))
    print(name, 'readlink', err(lambda: os.readlink('/proc/%d/fd/0' % pid)))
    print(name, 'environ', err(lambda: open('/proc/%d/environ' % pid, 'rb').read()))
"#
    );
    let r = gw.exec(&["python3", "-c", &probe]).await;
    let out = r.out();
    assert_eq!(r.exit, Some(0), "{r:?}\n{}", sup.log());
    let got = |who: &str, what: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{who} {what} ")))
            .unwrap_or_else(|| panic!("no `{who} {what}` in:\n{out}"))
            .to_string()
    };
    for who in ["victim", "supervisor"] {
        // The shape this test is about: no PID namespace, so both are in the exec's /proc.
        assert_eq!(got(who, "visible"), "True", "{out}");
        // Landlock's signal scope (the victim has the same uid: only the scope stops it).
        assert_eq!(got(who, "kill0"), "EPERM", "{out}");
        assert_eq!(got(who, "sigterm"), "EPERM", "{out}");
        // Landlock's ptrace rule (and, for the supervisor, its uid). The victim's fd directory
        // is its uid's, mode 0500, so its *numbers* can be listed; what they are and their
        // files need ptrace access.
        let listing = if who == "victim" { "ok" } else { "EACCES" };
        assert_eq!(got(who, "fds"), listing, "{out}");
        assert_eq!(got(who, "stdin"), "EACCES", "{out}");
        assert_eq!(got(who, "readlink"), "EACCES", "{out}");
        assert_eq!(got(who, "environ"), "EACCES", "{out}");
    }
    assert!(!victim.is_finished(), "the victim exec ended early");
    victim.abort();
}
