//! Pause points: a way for race tests to hold the supervisor between a check and a use.
//!
//! A race such as "an entry is checked, then opened by path" is won by an attacker only by
//! luck, so a test of it passes or fails by luck too. With the `test-pause-points` cargo
//! feature, the supervisor stops at each named point whose name is in `OSB_PAUSE_AT` (a comma
//! separated list) until the test lets it go, so the attack runs at exactly the worst moment:
//! it wins every time without the fix and never with it.
//!
//! Protocol, with `OSB_PAUSE_DIR=D`: on reaching point `P` the supervisor creates `D/P.reached`,
//! then waits (polling, at most 60 s) until `D/P.go` exists, removes it and goes on. A point is
//! held on every pass.
//!
//! Release and static builds never enable the feature: there, [`point`] is an empty inline
//! function and no environment variable is read.

/// Stop at the point `name` if a test asked for it. See the module docs.
#[cfg(feature = "test-pause-points")]
pub fn point(name: &str) {
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    let Ok(list) = std::env::var("OSB_PAUSE_AT") else {
        return;
    };
    if !list.split(',').any(|p| p == name) {
        return;
    }
    let Some(dir) = std::env::var_os("OSB_PAUSE_DIR").map(PathBuf::from) else {
        return;
    };
    let reached = dir.join(format!("{name}.reached"));
    let go = dir.join(format!("{name}.go"));
    let _ = std::fs::write(&reached, std::process::id().to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !go.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = std::fs::remove_file(&go);
    let _ = std::fs::remove_file(&reached);
}

/// Stop at the point `name` if a test asked for it: compiled out of this build.
#[cfg(not(feature = "test-pause-points"))]
#[inline(always)]
pub fn point(_name: &str) {}

/// Whether a test asked for any pause point: work that must never stop on the proxy's own
/// thread (an identity lookup, whose points a test holds) then runs where it may.
#[cfg(feature = "test-pause-points")]
pub fn armed() -> bool {
    std::env::var_os("OSB_PAUSE_AT").is_some_and(|v| !v.is_empty())
}

/// Whether a test asked for any pause point: never in this build.
#[cfg(not(feature = "test-pause-points"))]
#[inline(always)]
pub fn armed() -> bool {
    false
}
