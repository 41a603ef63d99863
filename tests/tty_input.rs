//! `run --tty` passes the end of our input on: the child reads EOF on its terminal (the line
//! discipline's EOF character, as `script` sends it) once our stdin ends, and what was piped
//! in arrives whole first, a last line without a newline included. Through the real binary.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::text;
use support::{BIN, Workdir, require, which};

/// `run --tty -q --workdir WD -- CMD` with `input` on its stdin (`None`: /dev/null), killed
/// after 60 s: a child that never sees EOF would otherwise hang the test.
fn tty_run(wd: &Workdir, input: Option<&[u8]>, cmd: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(["run", "--tty", "-q", "--workdir"])
        .arg(wd.path())
        .arg("--")
        .args(cmd)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(data) = input {
        let mut stdin = child.stdin.take().unwrap();
        let data = data.to_vec();
        // A writer thread: the pty echoes the input, so our reading must go on meanwhile.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let pid = child.id() as i32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if flag.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: kill of the run this test spawned and has not reaped yet.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    out
}

/// The child's last line of output (the pty echoes the input before it).
fn last_line(out: &Output) -> String {
    text(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .rfind(|l| !l.is_empty())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn an_empty_input_is_eof_on_the_tty() {
    if !require(which("python3"), "python3") {
        return;
    }
    let wd = Workdir::new();
    let py = "import sys; d = sys.stdin.read(); print('read', len(d))";
    let out = tty_run(&wd, Some(b""), &["python3", "-c", py]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(last_line(&out), "read 0");
    let out = tty_run(&wd, None, &["cat"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A partial last line needs the EOF character twice in canonical mode: the first only hands
/// the line over. Piped input (many lines, then one without a newline) arrives whole.
#[test]
fn piped_input_arrives_whole_then_eof() {
    if !require(which("python3"), "python3") {
        return;
    }
    let wd = Workdir::new();
    let mut data = Vec::new();
    for i in 0..3000 {
        writeln!(data, "line {i:05} {}", "x".repeat(50)).unwrap();
    }
    data.extend_from_slice(b"tail without a newline");
    // The result also goes to a file: on the terminal it follows the echo of 186 KB of
    // input, and the line discipline drops echoes it has no room for when the reader is slow
    // (a busy machine), so what precedes it on the last line is not ours to assert.
    let py = "import sys, hashlib\n\
              d = sys.stdin.buffer.read()\n\
              r = 'got %d %s' % (len(d), hashlib.sha256(d).hexdigest())\n\
              open('got.txt', 'w').write(r)\n\
              print('\\n' + r)";
    let out = tty_run(&wd, Some(&data), &["python3", "-c", py]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let digest = {
        let o = Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                c.stdin.take().unwrap().write_all(&data)?;
                c.wait_with_output()
            })
            .unwrap();
        text(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    let want = format!("got {} {digest}", data.len());
    let got = std::fs::read_to_string(wd.path().join("got.txt")).unwrap_or_default();
    assert_eq!(got, want);
    assert!(
        last_line(&out).ends_with(&want[3..]),
        "the result reaches the terminal: {:?}",
        last_line(&out)
    );
    // `cat` (line by line, canonical): every line and the partial one, then it ends.
    let out = tty_run(&wd, Some(b"one\ntwo"), &["cat"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    assert!(o.matches("one").count() >= 2 && o.contains("two"), "{o:?}");
}

/// A child that reads its terminal raw gets the EOF character as a byte of input, as a user's
/// ^D reaches a shell or a REPL. Our input is written only once the child is raw.
#[test]
fn in_raw_mode_eof_is_the_eof_character() {
    use std::io::Read;
    if !require(which("python3"), "python3") {
        return;
    }
    let wd = Workdir::new();
    let py = "import sys, tty, os\n\
              tty.setraw(0)\n\
              os.write(1, b'raw\\r\\n')\n\
              seen = b''\n\
              while b'\\x04' not in seen:\n    seen += os.read(0, 100)\n\
              os.write(1, repr(seen).encode() + b'\\r\\n')";
    let mut child = Command::new(BIN)
        .args(["run", "--tty", "-q", "--workdir"])
        .arg(wd.path())
        .args(["--", "python3", "-c", py])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stdout.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(100)) {
            seen.extend_from_slice(&b);
        }
        if stdin.is_some() && text(&seen).contains("raw") {
            stdin.take().unwrap().write_all(b"ab").unwrap();
        }
        if text(&seen).contains("\\x04") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text(&seen).contains("b'ab\\x04'"),
        "the child never read ^D: {:?}",
        text(&seen)
    );
}
