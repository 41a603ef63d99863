//! A corpus of short Python test-style programs (a few stdlib imports, a handful of `test_*`
//! functions with asserts), each run once as `openshell-sandbox run -- python3 FILE` and once
//! as bare `python3 FILE`, interleaved file by file (the order alternates), in one run. The
//! figure is total sandboxed wall / total bare wall. Run with `make bench` (as root: the
//! sandbox uid is 65534 for both sides, as in tests/workloads.rs).
//!
//! - `-- --quick`: one round instead of three.
//! - `OSB_BENCH_BASE_BIN=/path/to/openshell-sandbox`: a third side, the same `run` with that
//!   binary (a build from before a change), in the same interleaved rounds.
//! - `OSB_BENCH_TIMELINE=1`: where a run's time goes instead: the stages `run` stamps with
//!   `OSB_RUN_TIMELINE` (src/exec/run.rs), as medians over the corpus, and the in-process cost
//!   of the pieces of `Sandbox::new` (grant expansion, Landlock ruleset, seccomp build, cgroup
//!   mkdir/rmdir, uid lease, runtime start-up).

use std::os::unix::process::CommandExt;
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
const PROGRAMS: usize = 120;
const UID: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------------------------
// The corpus: PROGRAMS files, each made of three test functions picked from SNIPPETS by its
// index, with sizes that depend on the index, so every file differs and the set is the same
// on every run.

/// (imports, body of a test function using `n`).
const SNIPPETS: &[(&str, &str)] = &[
    (
        "json",
        "d = {'k%d' % j: list(range(j % 7)) for j in range(n)}\n    assert json.loads(json.dumps(d, sort_keys=True)) == d",
    ),
    (
        "re",
        "text = ' '.join('w%d' % j for j in range(n))\n    assert len(re.findall(r'w\\d+', text)) == n\n    assert re.sub(r'\\d', '', text).count('w') == n",
    ),
    (
        "collections",
        "c = collections.Counter(j % 10 for j in range(n))\n    assert sum(c.values()) == n\n    dq = collections.deque(range(n), maxlen=5)\n    assert list(dq) == list(range(n))[-5:]",
    ),
    (
        "itertools",
        "assert sum(1 for _ in itertools.permutations(range(5))) == 120\n    assert list(itertools.accumulate(range(n)))[-1] == n * (n - 1) // 2",
    ),
    (
        "math, fractions",
        "assert math.isclose(sum(1 / 2 ** j for j in range(50)), 2.0)\n    assert sum(fractions.Fraction(1, j * (j + 1)) for j in range(1, n)) == fractions.Fraction(n - 1, n)",
    ),
    (
        "hashlib, base64",
        "data = bytes(range(256)) * (n // 16 + 1)\n    h = hashlib.sha256(data).hexdigest()\n    assert len(h) == 64\n    assert base64.b64decode(base64.b64encode(data)) == data",
    ),
    (
        "datetime",
        "d0 = datetime.date(2024, 1, 1)\n    d1 = d0 + datetime.timedelta(days=n)\n    assert (d1 - d0).days == n\n    assert datetime.datetime.fromisoformat('2024-02-29T12:00:00').month == 2",
    ),
    (
        "dataclasses",
        "@dataclasses.dataclass(order=True)\n    class P:\n        x: int\n        y: int = 0\n    ps = sorted(P(j % 13, j) for j in range(n))\n    assert ps[0].x == 0 and dataclasses.asdict(ps[-1])['x'] == 12",
    ),
    (
        "functools",
        "@functools.lru_cache(maxsize=None)\n    def fib(k):\n        return k if k < 2 else fib(k - 1) + fib(k - 2)\n    assert fib(80) == 23416728348467685\n    assert functools.reduce(lambda a, b: a + b, range(n)) == n * (n - 1) // 2",
    ),
    (
        "heapq, bisect",
        "h = [(j * 7919) % n for j in range(n)]\n    heapq.heapify(h)\n    assert heapq.nsmallest(3, h) == sorted(h)[:3]\n    s = sorted(h)\n    assert bisect.bisect_left(s, s[n // 2]) <= n // 2",
    ),
    (
        "textwrap, string",
        "words = ' '.join(string.ascii_lowercase[j % 26] * 5 for j in range(n))\n    lines = textwrap.wrap(words, 40)\n    assert all(len(l) <= 40 for l in lines)\n    assert string.Template('$a-$b').substitute(a=1, b=n) == '1-%d' % n",
    ),
    (
        "statistics",
        "xs = [j % 17 for j in range(n)]\n    assert statistics.mean(range(1, 10)) == 5\n    assert 0 <= statistics.pstdev(xs) < 17",
    ),
    (
        "csv, io",
        "buf = io.StringIO()\n    w = csv.writer(buf)\n    w.writerows([j, 'x%d' % j, j * 1.5] for j in range(n))\n    rows = list(csv.reader(io.StringIO(buf.getvalue())))\n    assert len(rows) == n and rows[-1][1] == 'x%d' % (n - 1)",
    ),
    (
        "struct",
        "packed = struct.pack('<%dI' % n, *range(n))\n    assert len(packed) == 4 * n\n    assert struct.unpack('<%dI' % n, packed)[-1] == n - 1",
    ),
    (
        "enum",
        "class Color(enum.Enum):\n        RED = 1\n        GREEN = 2\n    assert Color(2) is Color.GREEN and len(list(Color)) == 2",
    ),
    (
        "random",
        "r = random.Random(n)\n    xs = [r.randint(0, 100) for _ in range(n)]\n    assert random.Random(n).randint(0, 100) == xs[0]\n    assert all(0 <= x <= 100 for x in xs)",
    ),
    (
        "os, pathlib",
        "p = pathlib.Path('corpus-out-%d.txt' % n)\n    p.write_text('x' * n)\n    assert p.stat().st_size == n\n    p.unlink()\n    assert not os.path.exists(p)",
    ),
    (
        "decimal",
        "decimal.getcontext().prec = 30\n    assert decimal.Decimal(1) / decimal.Decimal(7) > decimal.Decimal('0.142857')\n    assert sum(decimal.Decimal('0.1') for _ in range(10)) == decimal.Decimal('1.0')",
    ),
];

fn program(i: usize) -> String {
    let picks = [
        i % SNIPPETS.len(),
        (i * 7 + 3) % SNIPPETS.len(),
        (i * 11 + 5) % SNIPPETS.len(),
    ];
    let mut imports: Vec<&str> = picks
        .iter()
        .flat_map(|&p| SNIPPETS[p].0.split(", "))
        .collect();
    imports.sort();
    imports.dedup();
    let mut src = format!(
        "# corpus program {i} (generated by benches/corpus.rs)\nimport {}\n\n",
        imports.join(", ")
    );
    for (k, &p) in picks.iter().enumerate() {
        let n = 50 + (i * 37 + k * 101) % 400;
        src.push_str(&format!(
            "def test_{k}_{}():\n    n = {n}\n    {}\n\n",
            SNIPPETS[p].0.replace(", ", "_"),
            SNIPPETS[p].1
        ));
    }
    src.push_str(
        "if __name__ == '__main__':\n    tests = [f for name, f in sorted(globals().items()) if name.startswith('test_')]\n    for t in tests:\n        t()\n    print('passed', len(tests))\n",
    );
    src
}

fn write_corpus(dir: &Path) -> Vec<PathBuf> {
    (0..PROGRAMS)
        .map(|i| {
            let p = dir.join(format!("test_corpus_{i:03}.py"));
            std::fs::write(&p, program(i)).unwrap();
            if is_root() {
                std::os::unix::fs::chown(&p, Some(UID), Some(UID)).unwrap();
            }
            p
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The two ways of running one file.

/// `program` in `dir` with the bare side's environment (arguments and the uid are the caller's).
fn python_env(program: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir)
        .env("LANG", "C.UTF-8")
        .current_dir(dir)
        .stdin(Stdio::null());
    cmd
}

/// `cmd FILE`, timed; it must pass.
fn timed_python(side: &str, mut cmd: Command, file: &Path) -> Duration {
    cmd.arg(file);
    let t = Instant::now();
    let out = cmd.output().expect(side);
    let d = t.elapsed();
    assert!(
        out.status.success() && out.stdout.starts_with(b"passed 3"),
        "{side} {}: {} {}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

fn bare(dir: &Path, file: &Path) -> Duration {
    let mut cmd = python_env(Path::new("python3"), dir);
    if is_root() {
        cmd.uid(UID).gid(UID);
    }
    timed_python("bare", cmd, file)
}

/// The file under benches/floor/floor.c (the view's namespaces and mounts, nothing else), as
/// the same uid as the bare side (FLOOR_UID: the floor's own switch, after its namespaces).
fn floored(floor: &Path, python: &Path, dir: &Path, file: &Path) -> Duration {
    let mut cmd = python_env(floor, dir);
    cmd.arg(python);
    if is_root() {
        cmd.env("FLOOR_UID", UID.to_string());
    }
    timed_python("floor", cmd, file)
}

/// python3 as the bare side finds it.
fn python_path() -> Option<PathBuf> {
    ["/usr/local/bin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join("python3"))
        .find(|p| p.exists())
}

fn sandboxed_cmd(dir: &Path, file: &Path) -> Command {
    sandboxed_cmd_with(&bin(), dir, file)
}

/// `OSB_BENCH_BASE_BIN`: another build of the binary (from before a change), run as a third
/// side in the same interleaved rounds.
fn base_bin() -> Option<String> {
    std::env::var_os("OSB_BENCH_BASE_BIN").map(|b| b.to_string_lossy().into_owned())
}

fn sandboxed_cmd_with(bin: &str, dir: &Path, file: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("run").arg("-q").arg("--workdir").arg(dir);
    if is_root() {
        cmd.args(["--uid", &UID.to_string()]);
    } else {
        cmd.arg("--allow-degraded");
    }
    cmd.arg("--")
        .arg("python3")
        .arg(file)
        .env_clear()
        .current_dir(dir)
        .stdin(Stdio::null());
    cmd
}

fn sandboxed(dir: &Path, file: &Path) -> Duration {
    sandboxed_with(&bin(), dir, file)
}

fn sandboxed_with(bin: &str, dir: &Path, file: &Path) -> Duration {
    let mut cmd = sandboxed_cmd_with(bin, dir, file);
    let t = Instant::now();
    let out = cmd.output().expect("openshell-sandbox");
    let d = t.elapsed();
    assert!(
        out.status.success() && out.stdout.starts_with(b"passed 3"),
        "sandboxed {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------------------------------------
// Timeline mode.

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec on our stack.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One sandboxed run with `OSB_RUN_TIMELINE`: (stage, ns since the previous stage), from
/// just before our spawn of the binary to just after we reaped it.
fn timeline_run(dir: &Path, file: &Path) -> Vec<(String, u64)> {
    let mut cmd = sandboxed_cmd(dir, file);
    cmd.env("OSB_RUN_TIMELINE", "1");
    let t0 = monotonic_ns();
    let out = cmd.output().expect("openshell-sandbox");
    let t_end = monotonic_ns();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("osb-timeline "))
        .expect("the binary prints its timeline (OSB_RUN_TIMELINE)");
    let mut prev = t0;
    let mut v = Vec::new();
    for kv in line.split(' ') {
        let (k, t) = kv.split_once('=').unwrap();
        let t: u64 = t.parse().unwrap();
        let label = if k == "main" {
            "exec of the binary, up to main".to_string()
        } else {
            k.to_string()
        };
        v.push((label, t - prev));
        prev = t;
    }
    v.push(("process exit, reaped".into(), t_end - prev));
    v
}

/// The median of `f` over `n` calls, in µs.
fn time_us(n: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    median(&mut v).as_secs_f64() * 1e6
}

fn components(dir: &Path) {
    use clap::Parser;
    use openshell_sandbox::cli::RunArgs;
    use openshell_sandbox::policy::{
        Policy, absent_root_only_denies, expand_grants, expand_grants_skipping,
    };
    use openshell_sandbox::sandbox::{cgroup, identity::UidLease, landlock, seccomp};

    let uid = UID.to_string();
    let dir_s = dir.display().to_string();
    let argv = ["run", "--workdir", &dir_s, "--uid", &uid, "--", "python3"];
    let args = RunArgs::parse_from(argv);
    let policy = Policy::from_args(&args.policy, dir, Vec::new()).unwrap();
    let n = 200;
    println!("in-process cost of the pieces, median of {n} calls:");
    let row = |what: &str, us: f64| println!("  {what:<58} {us:>8.0} µs");
    row(
        "clap: parse the run command line",
        time_us(n, || {
            let _ = RunArgs::parse_from(argv);
        }),
    );
    row(
        "Policy::from_args (workdir, defaults)",
        time_us(n, || {
            let _ = Policy::from_args(&args.policy, dir, Vec::new()).unwrap();
        }),
    );
    row(
        "tokio current-thread runtime, enable_all: build + drop",
        time_us(n, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            drop(rt);
        }),
    );
    row(
        "a thread spawned and joined (the stdin feeder's cost)",
        time_us(n, || std::thread::spawn(|| ()).join().unwrap()),
    );
    let rules = expand_grants(&policy.fs).unwrap();
    row(
        &format!(
            "grant expansion, every deny path split (before session 3), {} rules",
            rules.len()
        ),
        time_us(n, || {
            let _ = expand_grants(&policy.fs).unwrap();
        }),
    );
    if let Ok(support) = landlock::probe() {
        row(
            "Landlock: probe the ABI",
            time_us(n, || {
                let _ = landlock::probe();
            }),
        );
        row(
            &format!("Landlock: build the ruleset ({} rules)", rules.len()),
            time_us(n, || {
                let _ = landlock::prepare(&rules, policy.network, support).unwrap();
            }),
        );
        // What `run` does with its private mount namespace: the deny paths that are missing
        // and that only root could create do not split their parent (SECURITY.md finding 48;
        // /etc/openshell and /etc/openshell-tls split /etc into one rule per entry), checked
        // twice, around the view, as prepare does.
        let unsplit = absent_root_only_denies(&policy.fs);
        let fewer = expand_grants_skipping(&policy.fs, &unsplit).unwrap();
        row(
            &format!(
                "as run does: 2 x the missing-deny check + expansion + ruleset, {} rules",
                fewer.len()
            ),
            time_us(n, || {
                let a = absent_root_only_denies(&policy.fs);
                let b = absent_root_only_denies(&policy.fs);
                let skip = a.intersection(&b).cloned().collect();
                let r = expand_grants_skipping(&policy.fs, &skip).unwrap();
                let _ = landlock::prepare(&r, policy.network, support).unwrap();
            }),
        );
    }
    row(
        "seccomp: build the BPF program",
        time_us(n, || {
            let _ = seccomp::build(policy.network).unwrap();
        }),
    );
    if is_root() {
        row(
            "cgroup: detect + make the supervisor's root, then remove it",
            time_us(n, || drop(cgroup::detect())),
        );
        if let Some(root) = cgroup::detect() {
            row(
                "cgroup: one exec group (mkdir, limits, open) + rmdir",
                time_us(n, || drop(root.take_exec(&policy.limits).unwrap())),
            );
        }
        row(
            "uid lease (what run takes without --uid): lock + unlock",
            time_us(n, || {
                drop(UidLease::take(1_900_000_000, 1_900_000_999).unwrap())
            }),
        );
    }
    row(
        "Sandbox::new as a whole (validate, prepare every layer, drop)",
        time_us(n, || {
            drop(openshell_sandbox::exec::Sandbox::new(supervisor(), policy.clone()).unwrap());
        }),
    );
}

/// The child's side: each corpus file spawned in-process through `Sandbox::spawn` (no `run`
/// process around it), with all layers and with one layer removed at a time, interleaved with
/// a plain spawn, so the cost a layer adds to the running program shows apart from the
/// supervisor's own start-up.
fn per_layer(dir: &Path, files: &[PathBuf]) {
    use clap::Parser;
    use openshell_sandbox::cli::RunArgs;
    use openshell_sandbox::exec::{Sandbox, SpawnSpec, Stdio as SStdio};
    use openshell_sandbox::policy::Policy;
    use openshell_sandbox::sandbox;

    let dir_s = dir.display().to_string();
    let uid = UID.to_string();
    let mut argv = vec!["run", "--workdir", &dir_s];
    if is_root() {
        argv.extend(["--uid", &uid]);
    } else {
        argv.push("--allow-degraded");
    }
    argv.extend(["--", "python3"]);
    let args = RunArgs::parse_from(argv);
    let pol = Policy::from_args(&args.policy, dir, Vec::new()).unwrap();
    let variant = |f: &dyn Fn(&mut sandbox::Prepared)| {
        let mut p = sandbox::prepare(&pol).expect("prepare");
        f(&mut p);
        Sandbox::from_prepared(supervisor(), pol.clone(), p)
    };
    let variants: Vec<(&str, Sandbox)> = vec![
        (
            "all layers",
            Sandbox::new(supervisor(), pol.clone()).unwrap(),
        ),
        ("- landlock", variant(&|p| p.landlock = None)),
        ("- seccomp", variant(&|p| p.seccomp = None)),
        ("- cgroup", variant(&|p| p.cgroups = None)),
    ];
    let env = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), dir.as_os_str().to_owned()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut bares = Vec::new();
    rt.block_on(async {
        for f in files {
            bares.push(bare(dir, f));
            for (i, (_, sb)) in variants.iter().enumerate() {
                let t = Instant::now();
                let mut c = sb
                    .spawn(SpawnSpec {
                        argv: vec!["python3".into(), f.as_os_str().to_owned()],
                        env: env.clone(),
                        cwd: None,
                        stdin: SStdio::Null,
                        stdout: SStdio::Null,
                        stderr: SStdio::Null,
                        controlling_tty: false,
                        program_fd: None,
                    })
                    .await
                    .expect("spawn");
                let info = c.wait().await;
                times[i].push(t.elapsed());
                c.kill_tree()
                    .await
                    .expect("the sweep lists the exec's processes");
                assert_eq!(
                    info.code,
                    Some(0),
                    "{}, {}: {info:?}",
                    variants[i].0,
                    f.display()
                );
            }
        }
    });
    println!(
        "the program itself: spawn-to-exit of each corpus file in-process, medians over {}",
        files.len()
    );
    println!(
        "  {:<40} {:>9.0} µs",
        "bare python3 (std::process::Command)",
        median(&mut bares).as_secs_f64() * 1e6
    );
    for (i, (name, _)) in variants.iter().enumerate() {
        println!(
            "  {:<40} {:>9.0} µs",
            format!("Sandbox::spawn, {name}"),
            median(&mut times[i]).as_secs_f64() * 1e6
        );
    }
}

fn timeline(dir: &Path, files: &[PathBuf]) {
    for f in &files[..10] {
        timeline_run(dir, f);
    }
    // Interleaved as in the main measurement: a run of one kind right after one of the other
    // kind costs more than after its own kind (the caches are the other process's).
    let mut runs: Vec<Vec<(String, u64)>> = Vec::new();
    let mut bares: Vec<Duration> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if i % 2 == 0 {
            bares.push(bare(dir, f));
            runs.push(timeline_run(dir, f));
        } else {
            runs.push(timeline_run(dir, f));
            bares.push(bare(dir, f));
        }
    }
    println!(
        "where a sandboxed run's time goes: median per stage over {} programs",
        runs.len()
    );
    let mut total = 0.0;
    for (i, (stage, _)) in runs[0].iter().enumerate() {
        let mut v: Vec<u64> = runs.iter().map(|r| r[i].1).collect();
        v.sort();
        let m = v[v.len() / 2] as f64 / 1000.0;
        total += m;
        println!("  {stage:<40} {m:>9.0} µs");
    }
    println!("  {:<40} {total:>9.0} µs", "sum of the medians");
    println!(
        "  {:<40} {:>9.0} µs",
        "(bare python3, median, for comparison)",
        median(&mut bares).as_secs_f64() * 1e6
    );
    println!();
    components(dir);
    println!();
    per_layer(dir, files);
}

/// The bench process's one supervisor context, which every sandbox here spawns through.
fn supervisor() -> &'static openshell_sandbox::exec::Supervisor {
    static SUPERVISOR: std::sync::OnceLock<openshell_sandbox::exec::Supervisor> =
        std::sync::OnceLock::new();
    SUPERVISOR
        .get_or_init(|| openshell_sandbox::exec::Supervisor::new().expect("the supervisor context"))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dir = tempfile::Builder::new()
        .prefix("osb-corpus-")
        .tempdir()
        .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    if is_root() {
        std::os::unix::fs::chown(dir.path(), Some(UID), Some(UID)).unwrap();
    }
    let files = write_corpus(dir.path());
    if std::env::var_os("OSB_BENCH_TIMELINE").is_some() {
        timeline(dir.path(), &files);
        return;
    }
    // Warm up the page cache (python3, its stdlib, our binary) on both sides.
    for f in &files[..10] {
        bare(dir.path(), f);
        sandboxed(dir.path(), f);
    }
    let rounds = if quick { 1 } else { 3 };
    let base = base_bin();
    // The floor runs as root's child: only where we are root (it makes namespaces).
    let floor_dir = tempfile::tempdir().unwrap();
    let floor = match (is_root(), python_path()) {
        (true, Some(py)) => match floor::build(floor_dir.path()) {
            Ok(f) => Some((f, py)),
            Err(e) => {
                eprintln!("benches/corpus.rs: no floor row: {e}");
                None
            }
        },
        _ => None,
    };
    let mut fl = Vec::new();
    let mut b = Vec::new();
    let mut s = Vec::new();
    let mut o = Vec::new();
    let t_all = Instant::now();
    for round in 0..rounds {
        for (i, f) in files.iter().enumerate() {
            if (i + round) % 2 == 0 {
                b.push(bare(dir.path(), f));
                s.push(sandboxed(dir.path(), f));
            } else {
                s.push(sandboxed(dir.path(), f));
                b.push(bare(dir.path(), f));
            }
            if let Some(bin) = &base {
                o.push(sandboxed_with(bin, dir.path(), f));
            }
            if let Some((floor, py)) = &floor {
                fl.push(floored(floor, py, dir.path(), f));
            }
        }
    }
    let elapsed = t_all.elapsed();
    let tb: Duration = b.iter().sum();
    let ts: Duration = s.iter().sum();
    let who = if is_root() {
        "root, full sandbox, uid 65534"
    } else {
        "non-root, --allow-degraded"
    };
    println!(
        "{PROGRAMS} Python programs x {rounds} rounds, interleaved file by file ({who}; {:.1} s in all)",
        elapsed.as_secs_f64()
    );
    println!("| side | total wall | median per run | p90 |");
    println!("|---|---|---|---|");
    let (mb, pb) = (median(&mut b), p90(&mut b));
    let (msd, ps) = (median(&mut s), p90(&mut s));
    println!(
        "| bare `python3 FILE` | {:.0} ms | {:.2} ms | {:.2} ms |",
        ms(tb),
        ms(mb),
        ms(pb)
    );
    println!(
        "| `openshell-sandbox run -- python3 FILE` | {:.0} ms | {:.2} ms | {:.2} ms |",
        ms(ts),
        ms(msd),
        ms(ps)
    );
    // A further side: its row, and its ratio to bare.
    let other = |name: &str, what: &str, v: &mut Vec<Duration>| {
        let t: Duration = v.iter().sum();
        let (m, p) = (median(v), p90(v));
        println!(
            "| {name} | {:.0} ms | {:.2} ms | {:.2} ms |",
            ms(t),
            ms(m),
            ms(p)
        );
        println!(
            "RATIO {what} / bare = {:.3}; median overhead per run {:.2} ms",
            t.as_secs_f64() / tb.as_secs_f64(),
            ms(m) - ms(mb)
        );
    };
    if let Some(bin) = &base {
        other(
            &format!("`{bin} run -- python3 FILE` (base)"),
            "base",
            &mut o,
        );
    }
    if !fl.is_empty() {
        other(
            "floor: the view's namespaces and mounts alone (benches/floor/floor.c)",
            "floor (the least any sandbox with this view can reach)",
            &mut fl,
        );
    }
    println!(
        "RATIO total sandboxed / bare = {:.3} (target <= 1.18); median overhead per run {:.2} ms",
        ts.as_secs_f64() / tb.as_secs_f64(),
        ms(msd) - ms(mb)
    );
}
