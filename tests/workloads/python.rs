//! Python workloads: files, JSON and regular expressions, subprocesses, threads,
//! multiprocessing, SQLite in WAL mode, tempfile, a venv, and a unittest suite (passing and
//! failing), each compared with its unsandboxed run.

use super::*;

#[test]
fn python_files_json_re() {
    compare(&Workload {
        name: "python_files_json_re",
        files: &[
            (
                "notes/input.txt",
                "Alpha beta, GAMMA; alpha-beta.\nDelta 42 epsilon 7\n",
            ),
            (
                "main.py",
                r#"
import json, os, re, shutil, stat
os.makedirs("data/sub", exist_ok=True)
recs = [{"id": i, "name": f"item-{i}", "tags": ["t%d" % j for j in range(i % 4)]} for i in range(500)]
with open("data/records.json", "w") as f:
    json.dump(recs, f, indent=1, sort_keys=True)
with open("data/records.json") as f:
    assert json.load(f) == recs
text = open("notes/input.txt").read()
words = re.findall(r"[a-z]+", text.lower())
print("words", words)
print("numbers", [int(n) for n in re.findall(r"\d+", text)])
print("sub", re.sub(r"(?i)alpha", "A", text.splitlines()[0]))
os.rename("data/records.json", "data/sub/records.json")
shutil.copy("data/sub/records.json", "data/copy.json")
os.symlink("sub/records.json", "data/link.json")
assert json.load(open("data/link.json")) == recs
os.chmod("data/copy.json", 0o600)
print("mode", oct(stat.S_IMODE(os.stat("data/copy.json").st_mode)))
with open("data/log.txt", "a") as f:
    for i in range(3):
        f.write(f"line {i}\n")
print("size", os.path.getsize("data/sub/records.json") == os.path.getsize("data/copy.json"))
print("tree", sorted(os.listdir("data")), sorted(os.listdir("data/sub")))
os.remove("data/link.json")
shutil.rmtree("data/sub")
print("after", sorted(os.listdir("data")))
print("ok")
"#,
            ),
        ],
        cmd: &["python3", "main.py"],
        expect_lines: &["ok", "mode 0o600"],
        ..Default::default()
    });
}

#[test]
fn python_subprocess() {
    compare(&Workload {
        name: "python_subprocess",
        files: &[(
            "main.py",
            r#"
import subprocess, sys
r = subprocess.run(["sh", "-c", "echo out; echo err >&2; exit 3"], capture_output=True, text=True)
print("rc", r.returncode, r.stdout.strip(), r.stderr.strip())
r = subprocess.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"],
                   input="hello", capture_output=True, text=True, check=True)
print("child python", r.stdout.strip())
p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
out, _ = p.communicate(b"x" * 1000000)
print("cat", len(out), p.returncode)
open("f1", "w").close(); open("f2", "w").close()
print("shell", subprocess.check_output("ls | sort -r | tr '\\n' ' '", shell=True, text=True))
try:
    subprocess.run(["no-such-command-xyz"])
except FileNotFoundError as e:
    print("missing", e.errno)
try:
    subprocess.run(["sleep", "10"], timeout=0.3)
except subprocess.TimeoutExpired:
    print("timeout expired")
print("ok")
"#,
        )],
        cmd: &["python3", "main.py"],
        expect_lines: &["ok", "rc 3 out err", "missing 2", "timeout expired"],
        ..Default::default()
    });
}

#[test]
fn python_threading() {
    compare(&Workload {
        name: "python_threading",
        files: &[(
            "main.py",
            r#"
import threading, queue, concurrent.futures
total = 0
lock = threading.Lock()
def work(n):
    global total
    for i in range(n):
        with lock:
            total += i
ts = [threading.Thread(target=work, args=(20000,)) for _ in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print("total", total)
q = queue.Queue()
def producer():
    for i in range(1000): q.put(i)
    q.put(None)
got = []
def consumer():
    while (item := q.get()) is not None:
        got.append(item)
a, b = threading.Thread(target=producer), threading.Thread(target=consumer)
a.start(); b.start(); a.join(); b.join()
print("queue", len(got), sum(got))
with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
    print("pool", sum(ex.map(lambda x: x * x, range(1000))))
ev = threading.Event()
threading.Timer(0.05, ev.set).start()
print("event", ev.wait(5))
print("ok")
"#,
        )],
        cmd: &["python3", "main.py"],
        expect_lines: &["ok", "total 1599920000", "event True"],
        ..Default::default()
    });
}

/// Needs /dev/shm: multiprocessing's locks are POSIX semaphores (SemLock), which glibc
/// creates there.
#[test]
fn python_multiprocessing_pool() {
    compare(&Workload {
        name: "python_multiprocessing_pool",
        files: &[(
            "main.py",
            r#"
import multiprocessing as mp
def sq(x):
    return x * x
if __name__ == "__main__":
    with mp.Pool(4) as pool:
        print("map", sum(pool.map(sq, range(10000))))
        print("async", pool.apply_async(sq, (12,)).get(timeout=30))
    q = mp.Queue()
    p = mp.Process(target=q.put, args=("from child",))
    p.start(); print(q.get(timeout=30)); p.join()
    print("exitcode", p.exitcode)
    print("ok")
"#,
        )],
        cmd: &["python3", "main.py"],
        expect_lines: &["ok", "map 333283335000", "from child"],
        ..Default::default()
    });
}

#[test]
fn python_sqlite_wal() {
    compare(&Workload {
        name: "python_sqlite_wal",
        files: &[(
            "main.py",
            r#"
import sqlite3, threading
db = sqlite3.connect("app.db")
print("journal", db.execute("PRAGMA journal_mode=WAL").fetchone()[0])
db.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)")
with db:
    db.executemany("INSERT INTO kv VALUES (?, ?)", ((i, "v%d" % i) for i in range(20000)))
reader = sqlite3.connect("app.db")
with db:
    db.execute("UPDATE kv SET v = 'changed' WHERE k < 100")
    # A reader in WAL mode sees the last commit while a write transaction is open.
    print("reader", reader.execute("SELECT count(*) FROM kv WHERE v = 'changed'").fetchone()[0])
print("reader after", reader.execute("SELECT count(*) FROM kv WHERE v = 'changed'").fetchone()[0])
def writer(base):
    c = sqlite3.connect("app.db", timeout=30)
    with c:
        c.executemany("INSERT INTO kv VALUES (?, ?)", ((base + i, "t") for i in range(1000)))
    c.close()
ts = [threading.Thread(target=writer, args=(100000 * (n + 1),)) for n in range(4)]
for t in ts: t.start()
for t in ts: t.join()
print("rows", db.execute("SELECT count(*) FROM kv").fetchone()[0])
print("sorted", db.execute("SELECT v FROM kv ORDER BY v DESC, k LIMIT 1").fetchone()[0])
print("checkpoint", db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
print("integrity", db.execute("PRAGMA integrity_check").fetchone()[0])
db.close(); reader.close()
print("ok")
"#,
        )],
        cmd: &["python3", "main.py"],
        expect_lines: &[
            "ok",
            "journal wal",
            "reader 0",
            "reader after 100",
            "rows 24000",
        ],
        ..Default::default()
    });
}

/// Needs a writable /tmp: tempfile's default directory is TMPDIR or /tmp (it falls back to the
/// current directory when neither is writable, which prints a different gettempdir()).
#[test]
fn python_tempfile() {
    compare(&Workload {
        name: "python_tempfile",
        files: &[(
            "main.py",
            r#"
import os, tempfile
print("gettempdir", tempfile.gettempdir())
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "x.txt")
    open(p, "w").write("hello")
    print("tmpdir file", open(p).read(), os.path.dirname(d) == tempfile.gettempdir())
with tempfile.NamedTemporaryFile("w+") as f:
    f.write("named"); f.flush(); f.seek(0)
    print("named", f.read())
fd, path = tempfile.mkstemp(suffix=".dat")
os.write(fd, b"abc"); os.close(fd)
print("mkstemp", os.path.getsize(path)); os.remove(path)
with tempfile.SpooledTemporaryFile(max_size=10) as f:
    f.write(b"x" * 100); f.seek(0)
    print("spooled", len(f.read()))
print("ok")
"#,
        )],
        cmd: &["python3", "main.py"],
        expect_lines: &["ok", "gettempdir /tmp", "named named"],
        ..Default::default()
    });
}

/// `python3 -m venv` with pip (ensurepip), then a local package installed into it without
/// the network.
#[test]
fn python_venv() {
    compare(&Workload {
        name: "python_venv",
        files: &[
            (
                "mkwheel.py",
                r#"
import base64, hashlib, zipfile
files = {
    "hello_osb.py": "def greet():\n    return 'hello from the venv'\n",
    "hello_osb-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hello-osb\nVersion: 1.0\n",
    "hello_osb-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: workloads\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record += f"{name},sha256={digest},{len(text.encode())}\n"
files["hello_osb-1.0.dist-info/RECORD"] = record + "hello_osb-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile("hello_osb-1.0-py3-none-any.whl", "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
"#,
            ),
            (
                "main.sh",
                r#"set -e
python3 -m venv venv
venv/bin/python -c 'import sys; print("in venv", sys.prefix != sys.base_prefix)'
venv/bin/python -m pip --version | cut -d' ' -f1,2
python3 mkwheel.py
venv/bin/python -m pip install -q --no-index --disable-pip-version-check hello_osb-1.0-py3-none-any.whl
venv/bin/python -c 'import hello_osb; print(hello_osb.greet())'
venv/bin/python -m pip list --disable-pip-version-check --format=freeze | grep -i hello
echo ok
"#,
            ),
        ],
        cmd: &["bash", "main.sh"],
        expect_lines: &[
            "ok",
            "in venv True",
            "hello from the venv",
            "hello-osb==1.0",
        ],
        ..Default::default()
    });
}

const PY_TESTS: &str = r#"
import json, os, unittest

def add(a, b):
    return a + b

def test_add():
    assert add(2, 3) == 5

def test_json_roundtrip():
    data = {"a": [1, 2, {"b": None}]}
    assert json.loads(json.dumps(data)) == data

def test_files_in_cwd():
    with open("scratch.txt", "w") as f:
        f.write("x" * 10)
    assert os.path.getsize("scratch.txt") == 10
    os.remove("scratch.txt")

class TestStrings(unittest.TestCase):
    def test_upper(self):
        self.assertEqual("abc".upper(), "ABC")

    def test_raises(self):
        with self.assertRaises(ZeroDivisionError):
            1 / 0

    @unittest.skip("not today")
    def test_skipped(self):
        pass

    @unittest.expectedFailure
    def test_known_bug(self):
        assert add(1, 1) == 3
"#;

/// Collects a pytest-style file (plain `test_*` functions with asserts, plus TestCase
/// classes) and runs it with unittest, printing one line per test and no timings.
const PY_RUNNER: &str = r#"
import importlib, io, sys, unittest
mod = importlib.import_module(sys.argv[1])
suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
for name in sorted(dir(mod)):
    if name.startswith("test_") and callable(getattr(mod, name)):
        suite.addTest(unittest.FunctionTestCase(getattr(mod, name), description=name))
class Result(unittest.TextTestResult):
    def addSuccess(self, t): super().addSuccess(t); print("PASS", t.id())
    def addFailure(self, t, e): super().addFailure(t, e); print("FAIL", t.id())
    def addError(self, t, e): super().addError(t, e); print("ERROR", t.id())
    def addSkip(self, t, r): super().addSkip(t, r); print("SKIP", t.id(), r)
    def addExpectedFailure(self, t, e): super().addExpectedFailure(t, e); print("XFAIL", t.id())
r = unittest.TextTestRunner(stream=io.StringIO(), resultclass=Result).run(suite)
print("ran", r.testsRun, "failures", len(r.failures), "errors", len(r.errors))
sys.exit(0 if r.wasSuccessful() else 1)
"#;

#[test]
fn python_unittest_pytest_style_file() {
    compare(&Workload {
        name: "python_unittest",
        files: &[("test_calc.py", PY_TESTS), ("runner.py", PY_RUNNER)],
        cmd: &["python3", "runner.py", "test_calc"],
        expect_lines: &[
            "PASS test_add",
            "PASS test_files_in_cwd",
            "PASS test_calc.TestStrings.test_raises",
            "XFAIL test_calc.TestStrings.test_known_bug",
            "ran 7 failures 0 errors 0",
        ],
        ..Default::default()
    });
}

/// A failing test gives the same exit code (1) both ways, through `python3 -m unittest` itself.
#[test]
fn python_unittest_failure_exit_code() {
    compare(&Workload {
        name: "python_unittest_failure",
        files: &[
            (
                "test_bad.py",
                "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n\n    def test_bad(self):\n        self.assertEqual(1, 2)\n",
            ),
            ("runner.py", PY_RUNNER),
        ],
        cmd: &[
            "bash",
            "-c",
            "python3 -m unittest -q test_bad 2>/dev/null; echo \"unittest rc=$?\"; python3 runner.py test_bad",
        ],
        expect_code: 1,
        expect_lines: &["unittest rc=1", "FAIL test_bad.T.test_bad"],
        ..Default::default()
    });
}
