//! The fuzz_*.rs property harnesses.
//!
//! cargo-fuzz needs a nightly toolchain, which these machines do not have; the harnesses are
//! proptest properties instead. Each target first replays its seed corpus in
//! `fuzz/corpus/<target>/` (one input per file), then runs generated cases through [`run`].
//!
//! - By default a target runs a fixed number of cases, so a plain `cargo test` stays fast.
//! - `OSB_FUZZ_CASES=N` replaces every target's default case count, for a longer local run:
//!   `OSB_FUZZ_CASES=200000 cargo test --release --test fuzz_policy`
//! - `OSB_FUZZ_SECONDS=N` makes every target keep generating cases until N seconds have
//!   passed (for CI's fixed-time runs); with `OSB_FUZZ_CASES` as well, whichever comes first.
//!   Each target of a binary gets its own N seconds; cargo runs two of them at once here.

pub mod gateway_messages;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// The case count for a target: `OSB_FUZZ_CASES` when set, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("OSB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The wall-clock budget of a target, from `OSB_FUZZ_SECONDS`; `None` runs by case count.
pub fn seconds() -> Option<Duration> {
    std::env::var("OSB_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64)
}

/// Run `test` on generated cases with `config` (its `cases` is the count, see [`config`]), or
/// for the `OSB_FUZZ_SECONDS` budget. Panics with proptest's minimal failing input, as the
/// `proptest!` macro does. Returns how many cases ran.
pub fn run<S: Strategy>(
    name: &str,
    config: Config,
    strategy: &S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> u64 {
    try_run(name, config, strategy, test).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run`], returning the failure (with the minimal input) instead of panicking, so a caller
/// can add what it knows, such as a supervisor's log.
///
/// proptest stops only at a case count, so a timed run is a series of runners, each with a
/// fresh random seed and a batch sized from the measured time per case, until the deadline.
pub fn try_run<S: Strategy>(
    name: &str,
    config: Config,
    strategy: &S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> Result<u64, String> {
    let started = Instant::now();
    let Some(budget) = seconds() else {
        let n = config.cases;
        TestRunner::new(config)
            .run(strategy, &test)
            .map_err(|e| format!("{name}: {e}"))?;
        return Ok(u64::from(n));
    };
    let cap = std::env::var("OSB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    let (mut done, mut batch) = (0u64, 1u64);
    while done < cap && started.elapsed() < budget {
        let t = Instant::now();
        let cfg = Config {
            cases: batch.min(cap - done).min(1 << 20) as u32,
            ..config.clone()
        };
        let n = u64::from(cfg.cases);
        TestRunner::new(cfg)
            .run(strategy, &test)
            .map_err(|e| format!("{name}: after {done} passing cases: {e}"))?;
        done += n;
        // Aim for half the remaining time per batch, growing at most 4x: a slow case can
        // overshoot the deadline by one case, a fast target does not pay for a runner per case.
        let per_case = t.elapsed().as_secs_f64() / n as f64;
        let left = budget.saturating_sub(started.elapsed()).as_secs_f64();
        batch = ((left / per_case.max(1e-9)) / 2.0).clamp(1.0, (batch * 4) as f64) as u64;
    }
    eprintln!(
        "{name}: {done} cases in {:.1} s (OSB_FUZZ_SECONDS={})",
        started.elapsed().as_secs_f64(),
        budget.as_secs_f64()
    );
    Ok(done)
}

/// A proptest configuration with `cases(default)` cases and no regression files written next
/// to the sources (a failing input belongs in the seed corpus, by hand, with a name).
pub fn config(default: u32) -> Config {
    Config {
        cases: cases(default),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The seed corpus of one target: (file name, contents), sorted by name.
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .flatten()
        .map(|e| {
            let p: PathBuf = e.path();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "seed corpus {} is empty", dir.display());
    out
}

/// The runtime the live targets drive the real binary from: two workers, like the supervisor.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
