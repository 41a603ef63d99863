//! Spawn-to-exit of sandboxed `/bin/true` with every layer, against a plain
//! `std::process::Command` spawn of `/bin/true`, measured interleaved in one run, plus a
//! per-layer breakdown (each variant drops one layer, or one namespace kind). The sandboxed
//! rows join one view made up front, as every exec of a `serve` sandbox does; the last row
//! prepares a new sandbox and view for each exec, as a `run` does. Run with `make bench` (as
//! root for the identity, cgroup and namespace layers). The view uses the defaults: /tmp a
//! 256 MiB tmpfs, /dev/shm 64 MiB, hostname `sandbox`, a network namespace with only lo; each
//! exec gets a PID namespace of its own whose PID 1 is our init.
//!
//! `OSB_BENCH_SPAWN_ONLY=N`: only N rounds of the plain spawn and the all-layers spawn joining
//! the view, interleaved, and their medians (for `perf record` of the joining path alone).

use std::time::{Duration, Instant};

use openshell_sandbox::exec::{Sandbox, SpawnSpec, Stdio};
use openshell_sandbox::policy::{FsPolicy, Identity, Limits, NOBODY, NetworkMode, Policy};
use openshell_sandbox::sandbox;

const ROUNDS: usize = 200;

fn policy(workdir: &std::path::Path) -> Policy {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    Policy {
        fs: FsPolicy::with_defaults(workdir.to_path_buf()),
        network: NetworkMode::None,
        limits: Limits::default(),
        identity: root.then_some(Identity {
            uid: NOBODY,
            gid: NOBODY,
        }),
        allow_degraded: !root,
        namespaces: Default::default(),
    }
}

fn spec() -> SpawnSpec {
    SpawnSpec {
        argv: vec!["/bin/true".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: None,
        stdin: Stdio::Null,
        stdout: Stdio::Null,
        stderr: Stdio::Null,
        controlling_tty: false,
        program_fd: None,
    }
}

/// The baseline: std's spawn (posix_spawn fast path) of /bin/true, spawned and reaped on the
/// same process-manager thread as the sandboxed runs, so both sides pay the same thread hop
/// and wait path and only the spawn differs.
async fn plain() -> Duration {
    let t = Instant::now();
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let rx = supervisor()
        .manager()
        .spawn_plain(cmd)
        .await
        .expect("spawn /bin/true");
    let st = rx.await.expect("reaped");
    assert_eq!(st.status, 0);
    t.elapsed()
}

/// `run`'s way: a sandbox prepared for this one exec (policy checks, grant expansion, Landlock
/// ruleset, seccomp program, cgroup root, and a new view: every namespace made), the spawn,
/// then the sandbox dropped (its view's namespaces released, the cgroup root removed).
async fn fresh(pol: &Policy) -> Duration {
    let t = Instant::now();
    let sb = Sandbox::new(supervisor(), pol.clone()).expect("a sandbox per exec");
    sb.one_exec_only();
    let mut c = sb.spawn(spec()).await.expect("sandboxed spawn");
    let info = c.wait().await;
    assert_eq!(info.code, Some(0), "{info:?}");
    c.kill_tree().await.expect("listing the exec's processes");
    drop(c);
    drop(sb);
    t.elapsed()
}

async fn sandboxed(sb: &Sandbox) -> Duration {
    let t = Instant::now();
    let mut c = sb.spawn(spec()).await.expect("sandboxed spawn");
    let info = c.wait().await;
    let d = t.elapsed();
    assert_eq!(info.code, Some(0), "{info:?}");
    c.kill_tree().await.expect("listing the exec's processes");
    d
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p90(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() * 9 / 10]
}

/// Where the time of a spawn joining the view goes: `OSB_SPAWN_TIMELINE`'s stamps
/// (sandbox/child/timeline.rs), in rounds of their own after the measured ones, so that the
/// stamps cost nothing above.
async fn stages(full: &Sandbox) {
    use openshell_sandbox::sandbox::child::timeline::{self, Mark};
    timeline::keep();
    let mut total = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        total.push(sandboxed(full).await);
    }
    let kept = timeline::kept();
    println!(
        "stages of the spawn joining the view ({} rounds with OSB_SPAWN_TIMELINE): median end after the job (p90), and the step from the stage before",
        kept.len()
    );
    let mut prev = 0.0;
    for m in Mark::ALL {
        let mut v: Vec<u64> = kept
            .iter()
            .filter_map(|r| r.iter().find(|(k, _)| *k == m).map(|(_, ns)| *ns))
            .collect();
        if v.is_empty() {
            continue;
        }
        v.sort_unstable();
        let med = v[v.len() / 2] as f64 / 1e3;
        println!(
            "  {:<16} {:>8.1}us ({:>8.1}us) {:>+8.1}us",
            m.name(),
            med,
            v[v.len() * 9 / 10] as f64 / 1e3,
            med - prev
        );
        prev = med;
    }
    println!(
        "  spawn-to-exit median in these rounds {:.0}us",
        median(&mut total).as_secs_f64() * 1e6
    );
}

/// The bench process's one supervisor context, which every sandbox here spawns through.
fn supervisor() -> &'static openshell_sandbox::exec::Supervisor {
    static SUPERVISOR: std::sync::OnceLock<openshell_sandbox::exec::Supervisor> =
        std::sync::OnceLock::new();
    SUPERVISOR
        .get_or_init(|| openshell_sandbox::exec::Supervisor::new().expect("the supervisor context"))
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let wd = tempfile::tempdir().unwrap();
        let pol = policy(wd.path());
        let full = Sandbox::new(supervisor(), pol.clone()).expect("full sandbox");
        if let Some(n) = std::env::var("OSB_BENCH_SPAWN_ONLY")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            let (mut base, mut all) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                base.push(plain().await);
                all.push(sandboxed(&full).await);
            }
            let (mb, ma) = (median(&mut base), median(&mut all));
            println!(
                "{n} rounds: plain {:.0}us, all layers joining the view {:.0}us, ratio {:.3}",
                mb.as_secs_f64() * 1e6,
                ma.as_secs_f64() * 1e6,
                ma.as_secs_f64() / mb.as_secs_f64()
            );
            return;
        }
        // One variant per layer, each with that layer removed from an otherwise full set.
        let variant = |f: &dyn Fn(&mut sandbox::Prepared)| {
            let mut p = sandbox::prepare(&pol).expect("prepare");
            f(&mut p);
            Sandbox::from_prepared(supervisor(), pol.clone(), p)
        };
        let variants: Vec<(&str, Sandbox)> = vec![
            ("- landlock", variant(&|p| p.landlock = None)),
            ("- seccomp", variant(&|p| p.seccomp = None)),
            ("- cgroup", variant(&|p| p.cgroups = None)),
            ("- rlimits", variant(&|p| p.rlimits.clear())),
            ("- identity", variant(&|p| p.identity.target = None)),
            (
                "- namespaces (no view, no init)",
                variant(&|p| p.view = Default::default()),
            ),
            ("- pid namespace and init", variant(&|p| p.view.pid = false)),
            (
                "- mount namespace and /proc",
                variant(&|p| p.view.mnt = None),
            ),
            (
                "- the exec's mount ns and /proc",
                variant(&|p| p.view.proc = sandbox::namespaces::ProcMount::None),
            ),
            ("- ipc namespace", variant(&|p| p.view.ipc = None)),
            ("- uts namespace", variant(&|p| p.view.uts = None)),
            ("- net namespace", variant(&|p| p.view.net = None)),
            (
                "no layers (fork + setsid only)",
                variant(&|p| {
                    p.landlock = None;
                    p.seccomp = None;
                    p.cgroups = None;
                    p.rlimits.clear();
                    p.identity.target = None;
                    p.view = Default::default();
                }),
            ),
        ];
        // Warm up page cache and the reaper.
        for _ in 0..20 {
            plain().await;
            sandboxed(&full).await;
        }
        let mut base = Vec::with_capacity(ROUNDS);
        let mut all = Vec::with_capacity(ROUNDS);
        let mut per_run = Vec::with_capacity(ROUNDS);
        let mut per: Vec<Vec<Duration>> = vec![Vec::with_capacity(ROUNDS); variants.len()];
        for _ in 0..ROUNDS {
            base.push(plain().await);
            all.push(sandboxed(&full).await);
            for (i, (_, sb)) in variants.iter().enumerate() {
                per[i].push(sandboxed(sb).await);
            }
            per_run.push(fresh(&pol).await);
        }
        let mb = median(&mut base);
        let ma = median(&mut all);
        println!("spawn-to-exit of /bin/true, {ROUNDS} interleaved rounds, medians (p90)");
        println!(
            "{:<42} {:>9} {:>9} {:>7}",
            "variant", "median", "p90", "ratio"
        );
        let row = |name: &str, v: &mut Vec<Duration>| {
            let m = median(v);
            println!(
                "{:<42} {:>7.0}us {:>7.0}us {:>7.2}",
                name,
                m.as_secs_f64() * 1e6,
                p90(v).as_secs_f64() * 1e6,
                m.as_secs_f64() / mb.as_secs_f64()
            );
        };
        row("plain std::process::Command", &mut base);
        row("all layers, joining the view (serve)", &mut all);
        for (i, (name, _)) in variants.iter().enumerate() {
            row(name, &mut per[i]);
        }
        row("all layers, a new sandbox and view (run)", &mut per_run);
        println!(
            "RATIO all-layers / plain = {:.3} (target <= 1.5 with namespaces)",
            ma.as_secs_f64() / mb.as_secs_f64()
        );
        for l in full.layers() {
            println!("  layer {:<15} {:?}: {}", l.layer, l.status, l.detail);
        }
        stages(&full).await;
    });
}
