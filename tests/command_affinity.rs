//! The command's CPU affinity. The exec's init narrows its own affinity to the CPU it runs on
//! for the command's clone (the command, which runs while the init sleeps in vfork, then
//! starts there at once), and the command widens its own and the init's back before anything
//! it runs could see them (src/sandbox/child/init.rs, `narrow_affinity`). Through the real
//! binary; needs root (the exec's PID namespace, whose fresh /proc shows the init as 1).

mod support;

use support::*;

/// The `Cpus_allowed_list:` lines of one or more concatenated /proc/PID/status files.
fn allowed(status: &str) -> Vec<String> {
    status
        .lines()
        .filter(|l| l.starts_with("Cpus_allowed_list:"))
        .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn the_command_and_its_init_keep_the_supervisors_affinity() {
    if !require_root() {
        return;
    }
    // The supervisor inherits this test's mask.
    let ours = allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    assert_eq!(ours.len(), 1, "{ours:?}");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !require(
        cpus > 1,
        "this test needs a mask of two CPUs or more (with one, a narrowed mask looks the same)",
    ) {
        return;
    }
    let wd = Workdir::new();
    // The command itself (cat reads its own status), then its init (PID 1 in the exec's PID
    // namespace). Several runs: the init may start on either CPU.
    for _ in 0..5 {
        let r = run(
            &wd,
            &[],
            &["/bin/cat", "/proc/self/status", "/proc/1/status"],
        );
        assert_eq!(r.code(), 0, "{}", r.stderr());
        let got = allowed(&r.stdout());
        assert_eq!(
            got,
            [ours[0].clone(), ours[0].clone()],
            "the command (first) or its init (second) was left on a narrowed CPU mask"
        );
    }
}
