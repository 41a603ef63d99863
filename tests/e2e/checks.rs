//! Checks of what the OCI runtime gave the pod, seen from the host and through `runc exec`: the
//! pod is configured as containerd configures the `agent` container, so the supervisor's
//! results below are the ones a real pod gets.

use crate::container::{AGENT_ADDED_CAPS, DEFAULT_CAPS, MASKED_PATHS, READONLY_PATHS, Seccomp};
use crate::pod::{Pod, SUPERVISOR};
use crate::scenario::Scenario;

/// Capability numbers (linux/capability.h) of the names the pods use.
fn cap_bit(name: &str) -> u64 {
    let n = match name {
        "CAP_CHOWN" => 0,
        "CAP_DAC_OVERRIDE" => 1,
        "CAP_FOWNER" => 3,
        "CAP_FSETID" => 4,
        "CAP_KILL" => 5,
        "CAP_SETGID" => 6,
        "CAP_SETUID" => 7,
        "CAP_SETPCAP" => 8,
        "CAP_NET_BIND_SERVICE" => 10,
        "CAP_NET_ADMIN" => 12,
        "CAP_NET_RAW" => 13,
        "CAP_SYS_CHROOT" => 18,
        "CAP_SYS_PTRACE" => 19,
        "CAP_SYS_ADMIN" => 21,
        "CAP_MKNOD" => 27,
        "CAP_AUDIT_WRITE" => 29,
        "CAP_SETFCAP" => 31,
        "CAP_SYSLOG" => 34,
        other => panic!("no capability number for {other}"),
    };
    1 << n
}

fn status_field(pid: i32, key: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
}

/// Mount points and their per-mount options, from the process's mountinfo.
fn mounts(pid: i32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(((*f.get(4)?).to_owned(), (*f.get(5)?).to_owned()))
        })
        .collect()
}

/// Step 3's runtime checks: the capability sets of (containerd's default set plus what
/// the pod adds), the seccomp mode asked for, containerd's masked and read-only paths, a
/// read-only cgroup mount in a cgroup namespace of its own.
pub fn runtime_shape(sc: &Scenario, pod: &Pod) {
    let pid = pod.init_pid;
    let want: u64 = DEFAULT_CAPS
        .iter()
        .chain(AGENT_ADDED_CAPS)
        .map(|c| cap_bit(c))
        .sum();
    for set in ["CapEff:", "CapPrm:", "CapBnd:"] {
        let got = status_field(pid, set).and_then(|v| u64::from_str_radix(&v, 16).ok());
        sc.check(got == Some(want), || {
            format!("PID 1's {set} is {got:x?}, expected {want:x} (containerd's default set plus SYS_ADMIN, NET_ADMIN, SYS_PTRACE, SYSLOG)")
        });
    }
    let mode = status_field(pid, "Seccomp:");
    let want_mode = match pod.seccomp {
        Seccomp::Unconfined => "0",
        Seccomp::RuntimeDefault => "2",
    };
    sc.check(mode.as_deref() == Some(want_mode), || {
        format!(
            "PID 1's seccomp mode is {mode:?}, expected {want_mode} for {:?}",
            pod.seccomp
        )
    });
    let m = mounts(pid);
    let opts = |path: &str| {
        m.iter()
            .rev()
            .find(|(p, _)| p == path)
            .map(|(_, o)| o.clone())
    };
    for p in MASKED_PATHS {
        // A path that does not exist on this kernel is skipped by the runtime.
        let exists = std::path::Path::new(p).exists();
        sc.check(!exists || opts(p).is_some(), || {
            format!("{p} is not masked in the pod")
        });
    }
    for p in READONLY_PATHS {
        let exists = std::path::Path::new(p).exists();
        let o = opts(p).unwrap_or_default();
        sc.check(!exists || o.split(',').any(|x| x == "ro"), || {
            format!("{p} is not read-only in the pod: {o:?}")
        });
    }
    let cgroup_mounts: Vec<&(String, String)> = m
        .iter()
        .filter(|(p, _)| p.starts_with("/sys/fs/cgroup/"))
        .collect();
    sc.check(
        !cgroup_mounts.is_empty()
            && cgroup_mounts
                .iter()
                .all(|(_, o)| o.split(',').any(|x| x == "ro")),
        || format!("the pod's cgroup mounts are not all read-only: {cgroup_mounts:?}"),
    );
    let me = std::process::id() as i32;
    sc.check(
        crate::container::ns_inode(me, "cgroup") != crate::container::ns_inode(pid, "cgroup"),
        || "the pod shares the test's cgroup namespace".into(),
    );
}

/// What the supervisor makes of the pod: `check --json` run in the pod by the runtime (same
/// namespaces, capabilities, seccomp and cgroup as PID 1). The pod's cgroup mounts are
/// read-only (checked by `runtime_shape`, on PID 1 itself, so the supervisor left them so); the
/// supervisor works through a private read-write copy of them (src/sandbox/cgroup_remount.rs),
/// so the cgroup layer is enforced and says so.
pub fn supervisor_on_read_only_cgroups(sc: &Scenario, pod: &Pod) -> String {
    let out = sc.ok(pod.container.exec(&[SUPERVISOR, "check", "--json"]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        sc.fail(format!(
            "`check --json` in the pod: {e}; stdout {:?} stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    });
    let row = report["layers"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["layer"] == "cgroup"))
        .cloned()
        .unwrap_or_default();
    sc.check(
        row["status"] == "enforced"
            && row["detail"].as_str().is_some_and(|d| {
                d.contains("read-only cgroup mounts used through a private read-write copy")
                    && d.contains("/sys/fs/cgroup/pids")
            }),
        || format!("the supervisor's cgroup layer in the pod: {row}"),
    );
    // The sandbox view can be made in the pod (root with CAP_SYS_ADMIN, under either seccomp
    // profile): every namespace kind is enforced.
    for kind in [
        "namespace-pid",
        "namespace-mount",
        "namespace-ipc",
        "namespace-uts",
        "namespace-net",
    ] {
        let l = report["layers"]
            .as_array()
            .and_then(|ls| ls.iter().find(|l| l["layer"] == kind))
            .cloned()
            .unwrap_or_default();
        sc.check(l["status"] == "enforced", || {
            format!("the supervisor's {kind} layer in pod {}: {l}", pod.name)
        });
    }
    row.to_string()
}

/// The name (and command line) the supervisor's init gives itself: PID 1 of every exec's PID
/// namespace.
pub const INIT_NAME: &str = "openshell-init";

/// The exec's private view inside a real pod: only its own processes (PID 1 is our
/// init), the sandbox's
/// hostname, a network namespace with only `lo`, private writable /tmp and /dev/shm that the
/// pod's later execs share, and a connect to the gateway that cannot leave the namespace.
pub async fn namespaces_in_pod(sc: &Scenario, pod: &Pod) {
    let tag = format!("osb-e2e-view-{}", std::process::id());
    // The glob is expanded by the shell before any `tr` runs, so the list holds the processes
    // that existed then: init and the exec's shells, every one carrying the tag.
    let r = pod
        .sh(&format!(
            ": {tag}; for p in /proc/[0-9]*; do echo \"${{p#/proc/}} $(tr '\\0' ' ' < $p/cmdline)\"; done"
        ))
        .await;
    let out = r.out();
    let procs: Vec<(&str, &str)> = out
        .lines()
        .map(|l| l.split_once(' ').unwrap_or((l, "")))
        .collect();
    let ok = r.exit == Some(0)
        && procs.first().map(|(p, c)| (*p, c.trim())) == Some(("1", INIT_NAME))
        && procs.len() >= 2
        && procs[1..].iter().all(|(_, c)| c.contains(&tag));
    sc.check(ok, || {
        format!(
            "pod {}: the exec sees processes other than its own: {procs:?} (exit {:?}, stderr {:?})",
            pod.name,
            r.exit,
            r.err()
        )
    });
    let r = pod
        .sh("hostname; tail -n +3 /proc/self/net/dev | cut -d: -f1 | tr -d ' '")
        .await;
    sc.check(r.exit == Some(0) && r.out() == "sandbox\nlo\n", || {
        format!(
            "pod {}: hostname and interfaces in the exec: {:?} (stderr {:?})",
            pod.name,
            r.out(),
            r.err()
        )
    });
    let r = pod
        .sh(&format!(
            "echo {tag} > /tmp/{tag} && echo shm > /dev/shm/{tag} && cat /tmp/{tag} /dev/shm/{tag}"
        ))
        .await;
    sc.check(
        r.exit == Some(0) && r.out() == format!("{tag}\nshm\n"),
        || {
            format!(
                "pod {}: /tmp and /dev/shm in the exec: {:?} (stderr {:?})",
                pod.name,
                r.out(),
                r.err()
            )
        },
    );
    let r = pod.sh(&format!("cat /tmp/{tag}")).await;
    sc.check(r.exit == Some(0) && r.out() == format!("{tag}\n"), || {
        format!(
            "pod {}: the next exec does not see the first one's /tmp file: {:?} (stderr {:?})",
            pod.name,
            r.out(),
            r.err()
        )
    });
    // The pod's own /tmp (the image's directory, seen from the host) did not get it.
    let host_side = std::fs::read_dir(format!("/proc/{}/root/tmp", pod.init_pid))
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy() == tag))
        .unwrap_or(false);
    sc.check(!host_side, || {
        format!(
            "pod {}: the exec's /tmp file is in the pod's /tmp",
            pod.name
        )
    });
}
