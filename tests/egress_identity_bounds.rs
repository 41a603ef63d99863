//! Who is calling, against a sandbox that makes the proxy read a lot: long argv chains, large
//! maps and environments, many processes. What the proxy reads, keeps and reports stays
//! bounded, and what lies past what it reads counts as evidence. Through the real binary
//! (`run --policy`), in tests/support/egress's world.

mod support;

use std::time::Duration;

use support::egress::binary::*;
use support::egress::identity::*;
use support::egress::*;

#[test]
fn the_argv_of_a_chain_is_bounded_in_what_the_proxy_reads_and_reports() {
    if !ready() {
        return;
    }
    World::run(|w| {
        // Absolute paths among the argv of the caller's chain go into the refusal and the log,
        // for hints. A chain whose every process has thousands of distinct ones must cost the
        // proxy little and say little.
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        let hostile = work.join("hostile");
        let (stdout, stderr) = run(
            w,
            &work,
            &[
                hostile.to_str().unwrap(),
                "argv",
                "3",
                "3000",
                "pub.test:8080",
            ],
        );
        let a = answers(&stdout);
        assert_eq!(a.len(), 1, "{stdout}\n{stderr}");
        let r = reason(&a[0]);
        let list = r
            .split_once("cmdline: [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(l, _)| l)
            .unwrap_or_else(|| panic!("{r}"));
        let paths: Vec<&str> = list.split(", ").collect();
        assert_eq!(paths.len(), 33, "{r}");
        assert_eq!(paths[0], "/1/0");
        assert_eq!(paths[32], "…");
        assert!(r.len() < 4096, "{} bytes", r.len());
        assert_eq!(w.upstream.total(), 0);
    });
}

/// The peak resident memory of process `pid` (`VmHWM`), in KiB.
fn peak_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .ok()
}

#[test]
fn what_the_proxy_keeps_of_each_process_is_small() {
    if !ready() {
        return;
    }
    World::run(|w| {
        // 48 processes with about 4 MiB of /proc/<pid>/maps text each (the most the proxy
        // reads), each making a connection: what the proxy remembers per process must not be
        // that text.
        let work = workdir(w, &policy(&format!("      - path: {SLEEP}\n")));
        let hostile = work.join("hostile");
        let mut c = run_command(
            w,
            &work,
            &[hostile.to_str().unwrap(), "bigmaps", "48", "pub.test:8080"],
        );
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let child = c.spawn().unwrap();
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let mut peak = 0;
        let out = loop {
            if let Some(p) = peak_kib(pid) {
                peak = peak.max(p);
            }
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(o) => break o.unwrap(),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(e) => panic!("{e}"),
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let a = answers(&stdout);
        assert_eq!(a.len(), 48, "{stdout}");
        for x in &a {
            assert!(
                reason(x).starts_with(&format!(
                    "binary '{}' not allowed in policy 'holder'",
                    hostile.display()
                )),
                "{x:?}"
            );
        }
        eprintln!("the supervisor's peak resident memory: {} MiB", peak / 1024);
        assert!(peak < 128 * 1024, "{} MiB", peak / 1024);
    });
}

#[test]
fn code_mapped_past_what_the_proxy_reads_is_not_hidden_by_it() {
    if !ready() || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        // The proxy reads at most 4 MiB of a process's maps. An allowed Python puts more than
        // that below its own code (a thousand mappings of a file at a long path, at fixed low
        // addresses), then loads an object from the workdir, which lands above them.
        let rules = "  py:
    endpoints:
      - {host: pub.test, port: 8080}
    binaries: [{path: /usr/bin/python3}]
";
        let work = workdir(w, &with_rules(rules));
        let so = evil_so(&work);
        let py = "import ctypes, os, sys, urllib.request
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
path = '.'
for _ in range(15):
    path += '/' + 'd' * 250
    os.makedirs(path, exist_ok=True)
fd = os.open(path + '/f', os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
for i in range(1100):
    # PROT_READ, MAP_PRIVATE | MAP_FIXED_NOREPLACE
    assert libc.mmap(0x100000000 + i * 0x2000, 4096, 1, 0x2 | 0x100000, fd, 0) == 0x100000000 + i * 0x2000
ctypes.CDLL(sys.argv[1])
try:
    print(urllib.request.urlopen('http://pub.test:8080/past').read().decode())
except urllib.error.HTTPError as e:
    print(e.read().decode())
";
        std::fs::write(work.join("client.py"), py).unwrap();
        let (stdout, stderr) = run(
            w,
            &work,
            &["/usr/bin/python3", "client.py", so.to_str().unwrap()],
        );
        assert!(
            stderr.contains("injected"),
            "the object was loaded: {stderr}"
        );
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 1, "{stdout}\n{stderr}");
        assert_eq!(j[0]["error"], "policy_denied", "{}", j[0]);
        let r = j[0]["reason"].as_str().unwrap();
        assert!(
            r.contains("(its mappings are more than 4 MiB of text, past what is read)"),
            "{r}"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}

#[test]
fn an_environment_longer_than_what_the_proxy_reads_is_evidence() {
    if !ready() || !have_path("/usr/bin/python3") {
        return;
    }
    World::run(|w| {
        // The proxy reads 4 MiB of an environment; with the stack limit raised (its hard
        // limit is the host's), an exec takes more, and the loader reads it all.
        let rules = "  py:
    endpoints:
      - {host: pub.test, port: 8080}
    binaries: [{path: /usr/bin/python3}]
";
        let work = workdir(w, &with_rules(rules));
        let so = evil_so(&work);
        let py = "import os, sys, urllib.request
if sys.argv[1] == 'pad':
    env = dict(os.environ)
    env.update({f'PAD{i}': 'x' * 120000 for i in range(40)})
    env['LD_PRELOAD'] = sys.argv[2]
    os.execve(sys.executable, [sys.executable, sys.argv[0], 'go'], env)
try:
    print(urllib.request.urlopen('http://pub.test:8080/padded').read().decode())
except urllib.error.HTTPError as e:
    print(e.read().decode())
";
        std::fs::write(work.join("client.py"), py).unwrap();
        let script = format!(
            "ulimit -s 65536 && /usr/bin/python3 client.py pad {}",
            so.display()
        );
        let (stdout, stderr) = run(w, &work, &["sh", "-c", &script]);
        assert!(
            stderr.contains("injected"),
            "the object was loaded: {stderr}"
        );
        let j = json_lines(&stdout);
        assert_eq!(j.len(), 1, "{stdout}\n{stderr}");
        assert_eq!(j[0]["error"], "policy_denied", "{}", j[0]);
        let r = j[0]["reason"].as_str().unwrap();
        assert!(
            r.contains("(its environment is more than 4 MiB, past what is read)"),
            "{r}"
        );
        assert_eq!(w.upstream.total(), 0);
    });
}
