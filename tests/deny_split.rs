//! A deny path that does not exist, and that only root could create, is not split around when
//! the run has its private mount namespace (src/policy/fs.rs `absent_root_only_denies`;
//! SECURITY.md "A missing deny path is not split around"). Through the real binary, as root.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{BIN, Workdir, require, require_root, run};

/// A directory tree whose every ancestor is root's and writable by nobody else (the build's
/// own tmp dir under target/, not /tmp, which is world-writable): `ro/` with three entries.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("osb-deny-split-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ro = dir.path().join("ro");
        for d in ["a", "b", "present"] {
            std::fs::create_dir_all(ro.join(d)).unwrap();
        }
        std::fs::write(ro.join("present/key"), "old secret").unwrap();
        Fixture { dir }
    }

    fn ro(&self) -> PathBuf {
        self.dir.path().join("ro")
    }
}

/// Every ancestor of `p` is root's and not writable by group or others.
fn root_only_chain(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    p.ancestors()
        .all(|a| std::fs::metadata(a).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0))
}

/// The number of Landlock path rules the run's report names ("ABI 7, N path rules").
fn path_rules(report: &serde_json::Value) -> usize {
    let layers = report["layers"].as_array().expect("layers in the report");
    let fs = layers
        .iter()
        .find(|l| l["layer"] == "landlock-fs")
        .expect("a landlock-fs layer");
    let detail = fs["detail"].as_str().unwrap();
    detail
        .split(", ")
        .find_map(|part| part.strip_suffix(" path rules"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rule count in {detail:?}"))
}

/// The fixture, when we are root and its directory's whole chain is root's alone (what makes
/// a missing deny path one that only root can create); else a loud skip.
fn root_only_fixture() -> Option<Fixture> {
    if !require_root() {
        return None;
    }
    let fx = Fixture::new();
    require(
        root_only_chain(fx.dir.path()),
        "the build's tmp dir (CARGO_TARGET_TMPDIR) and its ancestors owned by root, mode 0755",
    )
    .then_some(fx)
}

fn namespace_enforced(report: &serde_json::Value, layer: &str) -> bool {
    report["layers"].as_array().is_some_and(|ls| {
        ls.iter()
            .any(|l| l["layer"] == layer && l["status"] == "enforced")
    })
}

#[test]
fn a_missing_deny_path_costs_no_rules_and_an_existing_one_is_still_split() {
    let Some(fx) = root_only_fixture() else {
        return;
    };
    let wd = Workdir::new();
    let ro = fx.ro().display().to_string();
    let rules = |deny: Option<&str>| {
        let mut extra = vec!["--uid", "65534", "--ro", ro.as_str()];
        let d;
        if let Some(name) = deny {
            d = fx.ro().join(name).display().to_string();
            extra.extend(["--deny", d.as_str()]);
        }
        let r = run(&wd, &extra, &["true"]);
        assert_eq!(r.code(), 0, "{}", r.stderr());
        assert!(
            namespace_enforced(&r.report, "namespace-mount"),
            "the mount namespace must be enforced here: {}",
            r.report
        );
        path_rules(&r.report)
    };
    let none = rules(None);
    let missing = rules(Some("missing"));
    let present = rules(Some("present"));
    // `ro` stays one rule: nothing can appear at ro/missing in the view.
    assert_eq!(missing, none, "a missing deny path split its parent");
    // ro/present exists: ro is split into its other entries (a and b instead of ro).
    assert_eq!(
        present,
        none + 1,
        "an existing deny path must still be split around"
    );
}

#[test]
fn a_secret_mounted_at_a_missing_deny_path_during_the_run_stays_out_of_the_view() {
    let Some(fx) = root_only_fixture() else {
        return;
    };
    if !require(
        Path::new("/usr/bin/unshare").exists(),
        "util-linux unshare (the host-side mount is made in a private mount namespace)",
    ) {
        return;
    }
    let wd = Workdir::new();
    let ro = fx.ro();
    let secret_dir = ro.join("missing");
    let go = wd.path().join("go");
    // The host side runs in a mount namespace of its own (unshare -m, private propagation), so
    // the secret's tmpfs is never a mount of the machine's: the supervisor starts in it, the
    // run starts, then the mount point is made, a tmpfs mounted on it and the secret written;
    // only then may the command look.
    let script = r#"set -e
"$BIN" run -q --uid 65534 --workdir "$WD" --ro "$RO" --deny "$SECRET" -- \
  sh -c 'while [ ! -e "$0" ]; do sleep 0.02; done; ls -A "$1"; cat "$1/key"' "$GO" "$SECRET" \
  >"$WD/out" 2>"$WD/err" &
run=$!
sleep 0.5
mkdir "$SECRET"
mount -t tmpfs -o mode=0755 tmpfs "$SECRET"
echo 'new secret' >"$SECRET/key"
chmod 0644 "$SECRET/key"
: >"$GO"
set +e
wait $run
echo "rc=$?"
umount "$SECRET"
"#;
    let out = Command::new("/usr/bin/unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("BIN", BIN)
        .env("WD", wd.path())
        .env("RO", &ro)
        .env("SECRET", &secret_dir)
        .env("GO", &go)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let child_out = std::fs::read_to_string(wd.path().join("out")).unwrap_or_default();
    let child_err = std::fs::read_to_string(wd.path().join("err")).unwrap_or_default();
    assert!(out.status.success(), "{out:?}");
    assert!(
        !child_out.contains("new secret"),
        "the secret mounted during the run was read: {child_out}"
    );
    // The mount point itself is visible (same filesystem) and empty: the mount is not in the
    // view, so cat finds no file at all.
    assert!(
        child_err.contains("No such file or directory"),
        "expected ENOENT for the mounted secret, got stdout {child_out:?} stderr {child_err:?}"
    );
    assert!(text.contains("rc=1"), "cat must fail: {text} {child_err}");
}
