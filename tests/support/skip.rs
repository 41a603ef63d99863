//! Skipping loudly: a test that needs root, a tool or a kernel feature says which in its skip
//! message, and under `CI=true` a missing requirement fails the test instead, so that CI can
//! never go green by skipping.

use std::path::Path;

/// True when the test may run; false means "skip". Under CI=true a missing requirement fails
/// the test instead, so CI can never go green by skipping.
pub fn require(cond: bool, what: &str) -> bool {
    if cond {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "required for this test but absent: {what} (CI=true turns this skip into a failure)"
        );
    }
    eprintln!("SKIPPED: {what}");
    false
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn require_root() -> bool {
    require(
        is_root(),
        "this test needs root (to drop to the sandbox uid and create cgroups)",
    )
}

/// True when the binary under test was built with the `test-pause-points` feature (the race
/// tests need it; `make test` enables it). Skips loudly otherwise, and fails under CI=true.
pub fn require_pause_points() -> bool {
    require(
        cfg!(feature = "test-pause-points"),
        "the race tests need the binary built with --features test-pause-points (make test does)",
    )
}

/// Whether `tool` is an executable file in a directory of PATH.
pub fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Whether `path` exists; a skip (failing under CI=true) when it does not.
pub fn have_path(path: &str) -> bool {
    require(
        Path::new(path).exists(),
        &format!("{path} is required for this test"),
    )
}

/// Whether `tool` is on PATH; a skip (failing under CI=true) when it is not.
pub fn have(tool: &str) -> bool {
    require(which(tool), &format!("{tool} is required for this test"))
}
