//! The real-workload suite: what generated code really does (Python's stdlib, a C
//! build, git, Node, shell pipelines), run by the real binary under the default policy as uid
//! 65534, must give exactly the stdout and exit code it gives unsandboxed.
//!
//! Each workload runs twice in the same directory, once bare (as uid 65534, with the same
//! environment as the sandbox gives: PATH, HOME = the workdir, LANG) and once through `run`;
//! the directory is emptied and its input files written afresh in between. Every workload also
//! states what its bare run must print, so that two runs failing alike can never pass.

mod support;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::*;

const UID: u32 = 65534;
/// The environment `run` gives the child (src/exec/run.rs, `child_env`); the workdir is HOME.
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[derive(Default)]
struct Workload {
    name: &'static str,
    /// Input files, relative to the workdir (directories are made as needed).
    files: &'static [(&'static str, &'static str)],
    cmd: &'static [&'static str],
    /// Extra environment, given to both runs (`--env` for the sandboxed one).
    env: &'static [(&'static str, &'static str)],
    stdin: Option<Vec<u8>>,
    /// The exit code of the bare run.
    expect_code: i32,
    /// Lines the bare run's stdout must contain.
    expect_lines: &'static [&'static str],
}

struct Pair {
    bare: Output,
    sandboxed: Output,
    report: serde_json::Value,
}

fn populate(wd: &Path, files: &[(&str, &str)]) {
    for entry in std::fs::read_dir(wd).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
    for (rel, content) in files {
        let p = wd.join(rel);
        let parent = p.parent().unwrap();
        std::fs::create_dir_all(parent).unwrap();
        std::fs::write(&p, content).unwrap();
        let mut d = p.as_path();
        while d != wd {
            std::os::unix::fs::lchown(d, Some(UID), Some(UID)).unwrap();
            d = d.parent().unwrap();
        }
    }
}

fn feed(cmd: &mut Command, stdin: &Option<Vec<u8>>) -> Output {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning the workload");
    let writer = stdin.clone().map(|data| {
        let mut w = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            // The command may stop reading early; that is its business, as in a shell.
            let _ = w.write_all(&data);
        })
    });
    let out = child.wait_with_output().unwrap();
    if let Some(w) = writer {
        w.join().unwrap();
    }
    out
}

fn bare(wd: &Path, w: &Workload) -> Output {
    let mut cmd = Command::new(w.cmd[0]);
    cmd.args(&w.cmd[1..])
        .env_clear()
        .env("PATH", PATH)
        .env("HOME", wd)
        .env("LANG", "C.UTF-8")
        .envs(w.env.iter().copied())
        .current_dir(wd)
        // std drops the supplementary groups too when it switches uid as root.
        .uid(UID)
        .gid(UID);
    feed(&mut cmd, &w.stdin)
}

fn sandboxed(wd: &Path, w: &Workload) -> (Output, serde_json::Value) {
    let report = std::env::temp_dir().join(format!(
        "osb-workload-{}-{}.json",
        w.name,
        std::process::id()
    ));
    let _ = std::fs::remove_file(&report);
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg("--workdir")
        .arg(wd)
        .args(["--uid", &UID.to_string()])
        .arg("--report-json")
        .arg(&report);
    for (k, v) in w.env {
        cmd.arg("--env").arg(format!("{k}={v}"));
    }
    cmd.arg("--").args(w.cmd).current_dir(wd);
    let out = feed(&mut cmd, &w.stdin);
    let json = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&report);
    (out, json)
}

fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let start = s.len().saturating_sub(3000);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    s[start..].to_string()
}

/// Run `w` bare and sandboxed in one directory; check the bare run is what the workload
/// promises, and the sandboxed one gives the same stdout and exit code.
fn compare(w: &Workload) -> Option<Pair> {
    if !require_root() {
        return None;
    }
    let wd = Workdir::new();
    populate(wd.path(), w.files);
    let b = bare(wd.path(), w);
    let bout = String::from_utf8_lossy(&b.stdout);
    assert_eq!(
        b.status.code(),
        Some(w.expect_code),
        "{}: the bare run itself is not what the workload expects\nstdout: {}\nstderr: {}",
        w.name,
        tail(&b.stdout),
        tail(&b.stderr)
    );
    for line in w.expect_lines {
        assert!(
            bout.lines().any(|l| l == *line),
            "{}: the bare run did not print {line:?}\nstdout: {}\nstderr: {}",
            w.name,
            tail(&b.stdout),
            tail(&b.stderr)
        );
    }
    populate(wd.path(), w.files);
    let (s, report) = sandboxed(wd.path(), w);
    let same_out = s.stdout == b.stdout;
    assert!(
        same_out && s.status.code() == b.status.code(),
        "{}: sandboxed run differs from the bare one\n\
         exit code: bare {:?}, sandboxed {:?} (reason {})\n\
         stdout ({}):\n--- bare\n{}\n--- sandboxed\n{}\n\
         sandboxed stderr:\n{}",
        w.name,
        b.status.code(),
        s.status.code(),
        report["reason"],
        if same_out { "same" } else { "differs" },
        tail(&b.stdout),
        tail(&s.stdout),
        tail(&s.stderr)
    );
    Some(Pair {
        bare: b,
        sandboxed: s,
        report,
    })
}

fn have(tool: &str) -> bool {
    PATH.split(':').any(|d| Path::new(d).join(tool).exists())
}

// ---------------------------------------------------------------------------------------------
// C and tools

const HELLO_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
int main(int argc, char **argv) {
    int v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (i * 7919) % 1000;
    qsort(v, 1000, sizeof v[0], cmp);
    long sum = 0;
    for (int i = 0; i < 1000; i++) sum += (long)v[i] * i;
    FILE *f = fopen("out.txt", "w");
    if (!f) { perror("fopen"); return 2; }
    fprintf(f, "%ld\n", sum);
    fclose(f);
    printf("argc=%d sum=%ld first=%d last=%d\n", argc, sum, v[0], v[999]);
    return 0;
}
"#;

/// Needs a writable /tmp (or TMPDIR): gcc writes its intermediate assembly and object files
/// there.
#[test]
fn c_gcc_compile_and_run() {
    if !require(have("gcc"), "gcc (.ci/run installs it)") {
        return;
    }
    compare(&Workload {
        name: "c_gcc",
        files: &[("hello.c", HELLO_C)],
        cmd: &[
            "sh",
            "-c",
            "gcc -O2 -Wall -o hello hello.c && ./hello a b && cat out.txt",
        ],
        expect_lines: &["argc=3 sum=332833500 first=0 last=999", "332833500"],
        ..Default::default()
    });
}

/// Needs a writable /tmp (or TMPDIR), as gcc does.
#[test]
fn c_makefile_build() {
    if !require(have("gcc") && have("make"), "gcc and make") {
        return;
    }
    compare(&Workload {
        name: "c_make",
        files: &[
            ("src/util.h", "int triple(int x);\n"),
            (
                "src/util.c",
                "#include \"util.h\"\nint triple(int x) { return 3 * x; }\n",
            ),
            (
                "src/main.c",
                "#include <stdio.h>\n#include \"util.h\"\nint main(void) { printf(\"triple(14)=%d\\n\", triple(14)); return 0; }\n",
            ),
            (
                "Makefile",
                "CFLAGS = -O2 -Wall\nOBJS = build/main.o build/util.o\n\napp: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\nbuild/%.o: src/%.c src/util.h | build\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\nbuild:\n\tmkdir -p build\n\n.PHONY: clean\nclean:\n\trm -rf build app\n",
            ),
        ],
        cmd: &[
            "sh",
            "-c",
            "make -j2 --no-print-directory CC=gcc | sort && ./app && make --no-print-directory CC=gcc app && make -s clean && ls",
        ],
        expect_lines: &["triple(14)=42", "make: 'app' is up to date."],
        ..Default::default()
    });
}

#[test]
fn git_init_and_commit() {
    if !require(have("git"), "git") {
        return;
    }
    compare(&Workload {
        name: "git",
        files: &[("proj/README", "hello\n")],
        cmd: &[
            "sh",
            "-c",
            "set -e; cd proj; git init -b main; git add README; git commit -q -m first; \
             echo more >> README; git commit -q -am second; git log --format='%H %an %s'; \
             git status --porcelain; git rev-list --count HEAD; git cat-file -p HEAD:README",
        ],
        // Fixed names and dates make the commit ids the same in both runs.
        env: &[
            ("GIT_AUTHOR_NAME", "Sandbox Test"),
            ("GIT_AUTHOR_EMAIL", "test@example.invalid"),
            ("GIT_COMMITTER_NAME", "Sandbox Test"),
            ("GIT_COMMITTER_EMAIL", "test@example.invalid"),
            ("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z"),
            ("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z"),
        ],
        expect_lines: &["2", "hello", "more"],
        ..Default::default()
    });
}

// ---------------------------------------------------------------------------------------------
// Node

#[test]
fn node_fs_and_child_process() {
    if !require(have("node"), "node (.ci/run installs nodejs)") {
        return;
    }
    compare(&Workload {
        name: "node",
        cmd: &[
            "node",
            "-e",
            r#"
const fs = require('fs'), cp = require('child_process'), path = require('path');
fs.mkdirSync('out/deep', { recursive: true });
fs.writeFileSync('out/deep/a.json', JSON.stringify({ n: [1, 2, 3] }));
const back = JSON.parse(fs.readFileSync('out/deep/a.json', 'utf8'));
console.log('json', back.n.reduce((a, b) => a + b, 0));
fs.renameSync('out/deep/a.json', 'out/b.json');
console.log('dir', fs.readdirSync('out').sort().join(','));
console.log('exec', cp.execSync('echo hi from sh').toString().trim());
const r = cp.spawnSync('sh', ['-c', 'echo err >&2; exit 3']);
console.log('spawnSync', r.status, r.stderr.toString().trim());
console.log('node child', cp.execFileSync(process.execPath, ['-e', 'console.log(6 * 7)']).toString().trim());
fs.promises.readFile('out/b.json', 'utf8').then(s => {
  const c = cp.spawn('cat');
  let got = '';
  c.stdout.on('data', d => got += d);
  c.on('close', code => { console.log('async', got.length, code); console.log('ok'); });
  c.stdin.end(s.repeat(1000));
});
"#,
        ],
        expect_lines: &[
            "ok",
            "json 6",
            "exec hi from sh",
            "spawnSync 3 err",
            "node child 42",
        ],
        ..Default::default()
    });
}

// ---------------------------------------------------------------------------------------------
// Shell

#[test]
fn bash_pipelines() {
    compare(&Workload {
        name: "bash_pipelines",
        cmd: &[
            "bash",
            "-c",
            r#"set -o pipefail
seq 1 200000 | awk '{s += $1} END {printf "sum %.0f\n", s}'
seq 1 50000 | grep 7 | sort -rn | head -3 | paste -sd,
printf 'b\na\nc\na\n' | sort | uniq -c | sed 's/^ *//'
yes | head -n 2
echo words here | tr a-z A-Z | rev
(exit 3) | cat; echo "pipefail $?"
false | true; echo "status ${PIPESTATUS[*]}"
exec 3> fd3.txt; echo via fd3 >&3; exec 3>&-; cat fd3.txt
cat <(echo process substitution) <<< ignored
x=$(seq 1 5 | sort -rn | tr '\n' ' '); echo "captured $x"
exit 4"#,
        ],
        expect_code: 4,
        expect_lines: &[
            "sum 20000100000",
            "pipefail 3",
            "status 1 0",
            "via fd3",
            "captured 5 4 3 2 1 ",
        ],
        ..Default::default()
    });
}

/// Needs a writable /tmp (or TMPDIR): everyday tools spill to a temporary file there. `tac`
/// on a pipe, `sort` past its buffer, and a here-document larger than a pipe buffer in bash.
#[test]
fn shell_tools_that_spill_to_tmp() {
    compare(&Workload {
        name: "shell_spill",
        cmd: &[
            "bash",
            "-c",
            r#"seq 1 5 | tac | paste -sd,
seq 1 200000 | sort -S 64K -rn | head -2 | paste -sd,
big=$(seq 1 30000)
wc -l <<EOF
$big
EOF"#,
        ],
        expect_lines: &["5,4,3,2,1", "200000,199999", "30000"],
        ..Default::default()
    });
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

#[test]
fn bash_100mb_of_output() {
    let line = "the quick brown fox jumps over the lazy dog 0123456789";
    let Some(p) = compare(&Workload {
        name: "bash_100mb",
        cmd: &[
            "bash",
            "-c",
            "yes 'the quick brown fox jumps over the lazy dog 0123456789' | head -c 100000000",
        ],
        ..Default::default()
    }) else {
        return;
    };
    assert_eq!(p.bare.stdout.len(), 100_000_000);
    let whole = format!("{line}\n").repeat(100_000_000 / (line.len() + 1) + 1);
    assert_eq!(
        sha256_hex(&p.sandboxed.stdout),
        sha256_hex(&whole.as_bytes()[..100_000_000]),
        "the sandboxed stream is not the 100 MB the command wrote"
    );
    assert_eq!(p.report["stdout_bytes"], 100_000_000, "{}", p.report);
    assert_eq!(p.report["stdout_truncated"], false);
    // The same 100 MB through a pipe inside the sandbox, checksummed there.
    compare(&Workload {
        name: "bash_100mb_sha256sum",
        cmd: &[
            "bash",
            "-c",
            "yes 'the quick brown fox jumps over the lazy dog 0123456789' | head -c 100000000 | sha256sum",
        ],
        ..Default::default()
    });
}

/// With our stdin at /dev/null (as in most batch runs) the child sees what it would bare: a
/// read-only /dev/null, EOF on read, EBADF on write.
#[test]
fn stdin_from_dev_null() {
    compare(&Workload {
        name: "stdin_dev_null",
        cmd: &[
            "python3",
            "-c",
            "import os, stat, sys\n\
             print('read', repr(sys.stdin.read()))\n\
             print('chr', stat.S_ISCHR(os.fstat(0).st_mode))\n\
             try:\n    os.write(0, b'x')\nexcept OSError as e:\n    print('write errno', e.errno)",
        ],
        expect_lines: &["read ''", "chr True", "write errno 9"],
        ..Default::default()
    });
}

#[test]
fn stdin_from_a_pipe() {
    let mut input = Vec::new();
    for i in 0..100_000u64 {
        writeln!(input, "{},{}", i, (i * 2_654_435_761) % 1000).unwrap();
    }
    let expected_sum: u64 = (0..100_000u64).map(|i| (i * 2_654_435_761) % 1000).sum();
    let Some(p) = compare(&Workload {
        name: "stdin_pipe",
        cmd: &[
            "bash",
            "-c",
            r#"tee copy.csv | sort -t, -k2,2n -k1,1n | sha256sum
wc -l < copy.csv
head -3 copy.csv | while IFS=, read -r a b; do echo "row $a=$b"; done
python3 -c 'import sys; print("sum", sum(int(l.split(",")[1]) for l in open("copy.csv")))'"#,
        ],
        stdin: Some(input),
        expect_lines: &["100000", "row 0=0"],
        ..Default::default()
    }) else {
        return;
    };
    let out = String::from_utf8_lossy(&p.sandboxed.stdout);
    assert!(
        out.lines().any(|l| l == format!("sum {expected_sum}")),
        "{out}"
    );
}

#[path = "workloads/python.rs"]
mod python;
