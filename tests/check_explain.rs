//! `check --explain` prints exactly what `run` installs, for every network mode: the Landlock
//! and seccomp rules the run's commands get (dumped by the run itself, `OSB_DUMP_INSTALLED`),
//! the layer rows of the run's report, and what the kernel then does to the command's sockets.

mod support;

use std::process::Command;

use support::*;

const SOCKETS: &str = r#"
import errno, socket
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def inet():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
def connect():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(("127.0.0.1", 9))
print(attempt(inet), attempt(connect))
"#;

fn layer<'a>(layers: &'a serde_json::Value, name: &str) -> (&'a str, &'a str) {
    let l = layers
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == name)
        .unwrap_or_else(|| panic!("no layer {name} in {layers}"));
    (l["status"].as_str().unwrap(), l["detail"].as_str().unwrap())
}

#[test]
fn check_explain_shows_what_the_run_installs_for_each_network_mode() {
    if !require_root() || !require_pause_points() || !require(which("python3"), "python3") {
        return;
    }
    for mode in [
        &[][..],
        &["--network", "none"][..],
        &["--network", "all"][..],
    ] {
        let wd = Workdir::new();
        let out = Command::new(BIN)
            .args(["check", "--explain", "--json", "--workdir"])
            .arg(wd.path())
            .args(mode)
            .output()
            .unwrap();
        let check: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{mode:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(check["fully_enforced"], true, "{mode:?}: {check}");

        let dump = wd.path().join("..").join(format!(
            "osb-installed-{}-{}.json",
            std::process::id(),
            mode.len()
        ));
        let report = tempfile::NamedTempFile::new().unwrap();
        let out = Command::new(BIN)
            .arg("run")
            .arg("--workdir")
            .arg(wd.path())
            .arg("--report-json")
            .arg(report.path())
            .args(mode)
            .args(["--", "python3", "-c", SOCKETS])
            .env("OSB_DUMP_INSTALLED", &dump)
            .current_dir(wd.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mode:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let installed: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&dump).expect("the run dumps its rules"))
                .unwrap();
        let _ = std::fs::remove_file(&dump);
        let run_report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(report.path()).unwrap()).unwrap();

        // The rules, one for one.
        assert_eq!(check["landlock_rules"], installed["landlock"], "{mode:?}");
        assert_eq!(check["seccomp_rules"], installed["seccomp"], "{mode:?}");
        assert!(
            !installed["seccomp"].as_array().unwrap().is_empty(),
            "{installed}"
        );
        // The rows of the network layers, as the run reports them.
        for l in ["landlock-net", "landlock-scope", "seccomp", "namespace-net"] {
            assert_eq!(
                layer(&check["layers"], l),
                layer(&run_report["layers"], l),
                "{mode:?}: {l}"
            );
        }

        // And what the kernel did with them: seccomp's socket rule and Landlock's TCP rule
        // as listed are the ones the command met.
        let unix_only = installed["seccomp"].as_array().unwrap().iter().any(|r| {
            r.as_str()
                .unwrap()
                .contains("every family except AF_UNIX: EPERM")
        });
        let tcp_denied = installed["landlock"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["path"] == "(network)");
        let (inet, connect) = stdout.trim().split_once(' ').expect("two outcomes");
        if unix_only {
            assert_eq!(inet, "EPERM", "{mode:?}: {stdout}");
        } else {
            assert_eq!(inet, "ok", "{mode:?}: {stdout}");
            // Nothing listens on port 9: refused, unless Landlock denies the connect first.
            let want = if tcp_denied { "EACCES" } else { "ECONNREFUSED" };
            assert_eq!(connect, want, "{mode:?}: {stdout}");
        }
    }
}
