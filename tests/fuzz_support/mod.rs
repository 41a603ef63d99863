//! Shared by the fuzz_*.rs property harnesses.
//!
//! cargo-fuzz needs a nightly toolchain, which these machines do not have; the harnesses are
//! proptest properties instead, bounded by a number of cases, never by wall time. Each target
//! first replays its seed corpus in `fuzz/corpus/<target>/` (one input per file), then runs
//! generated cases.
//!
//! `OSB_FUZZ_CASES=N` replaces every target's default case count, for a longer local run:
//!     OSB_FUZZ_CASES=200000 cargo test --release --test fuzz_policy
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use proptest::test_runner::Config;

/// The case count for a target: `OSB_FUZZ_CASES` when set, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("OSB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
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
