//! The whole `run` process against bubblewrap: `openshell-sandbox run -q -- /bin/true` and
//! `bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp
//! /bin/true`, each spawned and reaped by this bench (fork, exec, every namespace made and torn
//! down, exit). Run with `make bench` as root (both sides then get every namespace; ours also
//! every other layer: Landlock, seccomp, cgroup, identity, rlimits).
//!
//! Two figures per side:
//! - **wall**: spawn-to-reaped of one invocation, median over interleaved rounds (each round
//!   runs every side once, the order rotating), so load drifts hit all sides alike;
//! - **machine CPU**: the busy time of the whole machine (/proc/stat: everything but idle and
//!   iowait) over a batch of consecutive invocations of one side plus a settle pause, minus the
//!   machine's busy rate measured just before in a pause of the same length, per invocation.
//!   Deferred kernel work (network namespace teardown in its workqueue, RCU callbacks) and
//!   helper processes count, which the children's rusage would miss; that rusage is printed
//!   next to it. /proc/stat counts in clock ticks (10 ms), so batches are long and the figure
//!   is the median over several batches. The machine is shared: other work shows as spread.
//!
//! A third figure, the one that compares like with like whatever the load: **tree CPU**, the
//! rusage of every process of one invocation (the bench is a child subreaper and reaps the
//! orphans too: bwrap's parent does not wait for its sandbox's init), median over the same
//! interleaved rounds as the wall.
//!
//! - `-- --quick`: fewer rounds and batches.
//! - `-- --load N` (or `OSB_BENCH_LOAD=N`): N busy threads of the bench's own spin during the
//!   rounds, a parallel CPU load (the machine-CPU batches are skipped then).
//! - `OSB_BENCH_BASE_BIN=/path/to/openshell-sandbox`: a third side, the same command with that
//!   binary (a build from before a change), measured in the same interleaved run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "floor/mod.rs"]
mod floor;

/// The binary measured: `OSB_BENCH_BIN` (what `make static` ships; `make bench` sets it to a
/// copy, because `cargo bench` rebuilds the binary in the same place with the dev-dependencies'
/// features unified in: 0.9 MB larger, and slower to start), else cargo's own build.
fn bin() -> String {
    std::env::var("OSB_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_openshell-sandbox").to_string())
}

struct Side {
    name: String,
    argv: Vec<String>,
}

impl Side {
    fn command(&self, cwd: &Path) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..])
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// Spawn-to-reaped wall time of one invocation. Its orphans (bwrap's sandbox init, which
    /// its parent does not wait for) are reaped too before the next one starts, outside the
    /// timed span.
    fn once(&self, cwd: &Path) -> Duration {
        self.once_with_cpu(cwd).0
    }

    /// [`Side::once`], and the CPU of the whole tree (every process of it, reaped).
    fn once_with_cpu(&self, cwd: &Path) -> (Duration, Duration) {
        let c0 = children_cpu();
        let t = Instant::now();
        let st = self.command(cwd).status().expect("spawning the side");
        let d = t.elapsed();
        assert!(st.success(), "{}: {st}", self.name);
        reap_orphans();
        (d, children_cpu() - c0)
    }
}

fn ours(bin: &str) -> Vec<String> {
    [bin, "run", "-q", "--", "/bin/true"]
        .map(String::from)
        .to_vec()
}

fn bwrap() -> Vec<String> {
    [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "/bin/true",
    ]
    .map(String::from)
    .to_vec()
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file())
}

/// (busy, total) clock ticks of the whole machine since boot.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let cpu = stat.lines().next().expect("the cpu line");
    let v: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// Reap every child left (orphans of the side's tree, re-parented to us as a subreaper),
/// waiting for each to exit.
fn reap_orphans() {
    loop {
        let mut st = 0;
        // SAFETY: waitpid with a stack status; ECHILD ends the loop.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// CPU time of all reaped children of this process so far: every process of each side's
/// tree, because the bench is a child subreaper and reaps the orphans too. (bwrap's parent
/// exits without waiting for its sandbox's init, so without that the init's and the command's
/// CPU, and the teardown of bwrap's namespaces in the init's exit, would be missing from
/// bwrap's figure.)
fn children_cpu() -> Duration {
    // SAFETY: getrusage fills a zeroed struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Machine CPU and the children's own CPU per invocation, over one batch of `n`.
fn cpu_batch(side: &Side, cwd: &Path, n: usize) -> (f64, f64) {
    let hz = ticks_per_sec();
    let settle = Duration::from_millis(50);
    // The batch itself, then a pause in which deferred work finishes.
    let (b0, _) = machine_ticks();
    let c0 = children_cpu();
    let t0 = Instant::now();
    for _ in 0..n {
        side.once(cwd);
    }
    std::thread::sleep(settle);
    let span = t0.elapsed();
    let (b1, _) = machine_ticks();
    let own = (children_cpu() - c0).as_secs_f64();
    // The machine's background over a pause of the same length, right after.
    let (q0, _) = machine_ticks();
    std::thread::sleep(span);
    let (q1, _) = machine_ticks();
    let busy = (b1 - b0) as f64 / hz;
    let background = (q1 - q0) as f64 / hz;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    BACKGROUND.with(|b| b.borrow_mut().push(background / span.as_secs_f64() / cores));
    ((busy - background).max(0.0) / n as f64, own / n as f64)
}

thread_local! {
    /// The machine's busy fraction (0..1 of all cores) in each background pause.
    static BACKGROUND: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("benches/run.rs: SKIPPED: needs root (every namespace on both sides)");
        return;
    }
    // Orphans of a side's tree come to us, so that their CPU counts in the rusage column.
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "benches/run.rs: cannot become a child subreaper: the rusage column undercounts bwrap"
        );
    }
    let Some(bw) = which("bwrap") else {
        eprintln!("benches/run.rs: SKIPPED: bwrap is not installed (apt-get install bubblewrap)");
        return;
    };
    // The run's workdir is the current directory (as `run -q -- /bin/true` typed in one).
    // Owned by nobody, so that `run` maps it to the uid it leases for the run (an idmapped
    // mount).
    let wd = tempfile::Builder::new()
        .prefix("osb-runbench-")
        .tempdir()
        .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(wd.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(wd.path(), Some(65534), Some(65534)).unwrap();
    }
    let mut sides = vec![
        Side {
            name: "openshell-sandbox run -q -- /bin/true".into(),
            argv: ours(&bin()),
        },
        Side {
            name: "bwrap --unshare-all ... /bin/true".into(),
            argv: {
                let mut a = bwrap();
                a[0] = bw.display().to_string();
                a
            },
        },
    ];
    if let Some(base) = std::env::var_os("OSB_BENCH_BASE_BIN") {
        let base = base.to_string_lossy().into_owned();
        sides.push(Side {
            name: format!("{base} run -q -- /bin/true (base)"),
            argv: ours(&base),
        });
    }
    let base_side = (sides.len() == 3).then_some(2);
    // The floor: what the kernel alone charges for the view's namespaces and mounts, with none
    // of the other layers (benches/floor/floor.c). No sandbox can be below it on this machine.
    let floor_dir = tempfile::tempdir().unwrap();
    let floor_side = match floor::build(floor_dir.path()) {
        Ok(floor_bin) => {
            sides.push(Side {
                name: "floor: the view's namespaces and mounts alone (benches/floor/floor.c)"
                    .into(),
                argv: vec![floor_bin.display().to_string(), "/bin/true".into()],
            });
            Some(sides.len() - 1)
        }
        Err(e) => {
            eprintln!("benches/run.rs: no floor row: {e}");
            None
        }
    };
    sides.push(Side {
        name: "bare /bin/true (for scale)".into(),
        argv: vec!["/bin/true".into()],
    });
    for s in &sides {
        for _ in 0..10 {
            s.once(wd.path());
        }
    }

    let args: Vec<String> = std::env::args().collect();
    let load_n = args
        .iter()
        .position(|a| a == "--load")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var("OSB_BENCH_LOAD").ok())
        .map_or(0, |n| {
            n.parse().expect("--load N: a number of busy threads")
        });
    let load = Load::start(load_n);
    let loaded = load.threads();
    let rounds = if quick { 60 } else { 300 };
    let mut wall: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); sides.len()];
    let mut tree: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); sides.len()];
    for r in 0..rounds {
        for k in 0..sides.len() {
            let i = (r + k) % sides.len();
            let (w, c) = sides[i].once_with_cpu(wd.path());
            wall[i].push(w.as_secs_f64() * 1e6);
            tree[i].push(c.as_secs_f64() * 1e6);
        }
    }

    // Under load the machine-CPU column means nothing: skip its batches.
    let (batches, per_batch) = match (load.threads(), quick) {
        (1.., _) => (0, 0),
        (0, true) => (3, 40),
        (0, false) => (9, 60),
    };
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut own: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for b in 0..batches {
        for k in 0..sides.len() {
            let i = (b + k) % sides.len();
            let (m, o) = cpu_batch(&sides[i], wd.path(), per_batch);
            cpu[i].push(m * 1e6);
            own[i].push(o * 1e6);
        }
    }

    drop(load);
    report(
        &sides,
        Measured {
            wall,
            tree,
            cpu,
            own,
        },
        Roles {
            base: base_side,
            floor: floor_side,
        },
        (rounds, batches, per_batch),
        loaded,
    );
}

/// Per side: each round's wall and tree CPU, each batch's machine CPU and rusage (µs).
struct Measured {
    wall: Vec<Vec<f64>>,
    tree: Vec<Vec<f64>>,
    cpu: Vec<Vec<f64>>,
    own: Vec<Vec<f64>>,
}

/// Which side is which (ours is the first, bwrap the second).
struct Roles {
    base: Option<usize>,
    floor: Option<usize>,
}

fn report(
    sides: &[Side],
    m: Measured,
    roles: Roles,
    (rounds, batches, per_batch): (usize, usize, usize),
    loaded: usize,
) {
    let Measured {
        mut wall,
        mut tree,
        mut cpu,
        mut own,
    } = m;
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "whole process, spawn to reaped: {rounds} interleaved rounds (wall, tree CPU), {batches} batches of {per_batch} (machine CPU); {}load {}",
        if loaded > 0 {
            format!("UNDER LOAD ({loaded} busy threads of this bench), ")
        } else {
            String::new()
        },
        loadavg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "| side | wall median | wall p90 | tree CPU (rusage, every process) median | machine CPU per run (median [min–max]) | rusage CPU in the batches |"
    );
    println!("|---|---|---|---|---|---|");
    let mut wall_med = Vec::new();
    let mut tree_med = Vec::new();
    let mut cpu_med = Vec::new();
    for (i, s) in sides.iter().enumerate() {
        let w = &mut wall[i];
        let m = median(w);
        let p90 = w[w.len() * 9 / 10];
        let t = median(&mut tree[i]);
        let (cm, cmin, cmax, om) = if cpu[i].is_empty() {
            (0.0, 0.0, 0.0, 0.0)
        } else {
            let c = &mut cpu[i];
            let cm = median(c);
            (cm, c[0], c[c.len() - 1], median(&mut own[i]))
        };
        println!(
            "| {} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs [{:.0}–{:.0}] | {:.0} µs |",
            s.name, m, p90, t, cm, cmin, cmax, om
        );
        wall_med.push(m);
        tree_med.push(t);
        cpu_med.push(cm);
    }
    let mut bg = BACKGROUND.with(|b| b.borrow().clone());
    if !bg.is_empty() {
        let bgm = median(&mut bg);
        println!(
            "machine busy without us (median of the pauses): {:.0} % of all cores{}",
            bgm * 100.0,
            if bgm > 0.25 {
                " -- too busy: the machine-CPU column is not trustworthy, use the tree CPU column"
            } else {
                ""
            }
        );
    }
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}", a / b)
        } else {
            "n/a".to_string()
        }
    };
    println!(
        "RATIO ours / bwrap: wall {:.2}{}, tree CPU {:.2} (target <= 1.5), machine CPU {}",
        wall_med[0] / wall_med[1],
        if loaded > 0 {
            " (target under load <= 1.3)"
        } else {
            ""
        },
        tree_med[0] / tree_med[1],
        ratio(cpu_med[0], cpu_med[1]),
    );
    if let Some(b) = roles.base {
        println!(
            "RATIO ours / base: wall {:.2}, tree CPU {:.2}, machine CPU {}",
            wall_med[0] / wall_med[b],
            tree_med[0] / tree_med[b],
            ratio(cpu_med[0], cpu_med[b]),
        );
    }
    if let Some(f) = roles.floor {
        println!(
            "RATIO floor / bwrap: wall {:.2}, tree CPU {:.2} (the least any sandbox with this view can reach); ours - floor: wall {:.0} µs (target <= 1600 µs), tree CPU {:.0} µs",
            wall_med[f] / wall_med[1],
            tree_med[f] / tree_med[1],
            wall_med[0] - wall_med[f],
            tree_med[0] - tree_med[f],
        );
    }
}

/// `OSB_BENCH_LOAD=N` (or `-- --load N`): N threads of this bench spin for the whole
/// measurement, a parallel CPU load as a build is (they count in no side's rusage).
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(n: usize) -> Load {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }

    fn threads(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
