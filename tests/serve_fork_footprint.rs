//! What an exec's init, a fork of the `serve` supervisor, keeps of the supervisor's memory
//! once its command runs (sys/forget.rs): none of its heap, none of the main thread's old
//! frames, only the argument area above the main thread's first frame. Through the real
//! binary against the test gateway; needs root (the exec's init is root's, and its memory
//! map is read from outside).

mod support;

use std::time::{Duration, Instant};

use support::exec::exec_stream;
use support::{AuthMode, SupOpts, is_root, require, up};

/// The pids of `parent`'s children (from every thread's children list).
fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let p = t.path().join("children");
        if let Ok(s) = std::fs::read_to_string(p) {
            out.extend(s.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
        }
    }
    out
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// (mappings, private writable anonymous mappings, anonymous KiB) of `pid`.
fn footprint(pid: u32) -> (usize, usize, u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let anon_rw = maps
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 5 && f[1].starts_with("rw") && f[4] == "0"
        })
        .count();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let anon = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Anonymous:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (maps.lines().count(), anon_rw, anon)
}

/// (start, end, resident KiB) of `pid`'s mapping named `name`.
fn named(pid: u32, name: &str) -> Option<(usize, usize, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut lines = smaps.lines();
    while let Some(l) = lines.next() {
        if !l.ends_with(name) {
            continue;
        }
        let range = l.split_whitespace().next()?;
        let (a, b) = range.split_once('-')?;
        let rss = lines
            .find_map(|x| x.strip_prefix("Rss:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        return Some((
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
            rss,
        ));
    }
    None
}

/// Field 28 of /proc/PID/stat: where the main thread's first frame is.
fn start_stack(pid: u32) -> usize {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(25).unwrap().parse().unwrap()
}

/// The supervisor's heap and its main thread's old frames are gone from a running exec's
/// init; what stays of its stack is the page of the main thread's first frame and above.
/// Also prints both processes' mappings (the fork's and the forget's sizes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inits_copy_of_the_supervisor() {
    if !require(
        is_root(),
        "root (the exec's init is root's; its maps are read from outside)",
    ) {
        return;
    }
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    assert_eq!(gw.sh("echo warm").await.exit, Some(0));
    let before = children(sup.pid());
    let mut rx = exec_stream(gw.state.clone(), gw.request(&["sleep", "5"]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let init = loop {
        if let Some(p) = children(sup.pid())
            .into_iter()
            .find(|p| !before.contains(p) && comm(*p) == "openshell-init")
        {
            break p;
        }
        assert!(Instant::now() < deadline, "no init appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The init forgets once the command has exec'd.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (sm, sa, sk) = footprint(sup.pid());
    let (im, ia, ik) = footprint(init);
    let threads = std::fs::read_dir(format!("/proc/{}/task", sup.pid()))
        .map(|d| d.count())
        .unwrap_or(0);
    eprintln!(
        "supervisor: {threads} threads, {sm} mappings ({sa} anonymous rw), {sk} KiB anonymous"
    );
    eprintln!("init:       {im} mappings ({ia} anonymous rw), {ik} KiB anonymous");
    if std::env::var_os("OSB_TEST_SHOW_MAPS").is_some() {
        eprintln!(
            "{}",
            std::fs::read_to_string(format!("/proc/{}/smaps", sup.pid())).unwrap_or_default()
        );
        eprintln!(
            "{}",
            std::fs::read_to_string(format!("/proc/{init}/maps")).unwrap_or_default()
        );
    }
    let (start, end, rss) = named(init, "[stack]").expect("the init's [stack]");
    let first = start_stack(sup.pid());
    assert!(
        start < first && first < end,
        "{start:#x} {first:#x} {end:#x}"
    );
    let kept_kib = ((end - (first & !4095)) / 1024) as u64;
    eprintln!("init [stack]: {rss} KiB resident, at most {kept_kib} KiB kept");
    assert!(
        rss <= kept_kib,
        "the init holds {rss} KiB of the main thread's stack"
    );
    let (_, _, heap) = named(init, "[heap]").expect("the init's [heap]");
    assert_eq!(heap, 0, "the init holds the supervisor's heap");
    // The argument area stays, scrubbed to the init's name (init.rs `scrub_identity`).
    let cmdline = std::fs::read(format!("/proc/{init}/cmdline")).unwrap();
    assert!(cmdline.starts_with(b"openshell-init"), "{cmdline:?}");
    while rx.recv().await.is_some() {}
}
