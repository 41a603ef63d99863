//! Temp space: every exec's /tmp and /dev/shm are private tmpfs of the flags' sizes, invisible
//! to a concurrent run and gone after, full at their size (ENOSPC), and /dev/shm's bytes count
//! toward the exec's memory.

use super::*;

const PY_TMPFS: &str = r#"
def mount_of(path):
    fstype = None
    for l in open("/proc/self/mountinfo"):
        a, b = l.split(" - ")
        if a.split()[4] == path:
            fstype = b.split()[0]
    return fstype
for d in ("/tmp", "/dev/shm"):
    st, vfs = os.stat(d), os.statvfs(d)
    with open(os.path.join(d, "w"), "w") as f:
        f.write("x")
    print(d, oct(st.st_mode), mount_of(d), vfs.f_blocks * vfs.f_frsize, open(os.path.join(d, "w")).read())
print("TMPDIR", os.environ.get("TMPDIR"))
"#;

/// /tmp and /dev/shm are private tmpfs mounts, mode 1777, of the default sizes, writable by the
/// sandbox uid; TMPDIR is /tmp. The flags set the sizes.
#[test]
fn tmp_and_dev_shm_are_private_tmpfs_of_the_flag_sizes() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    for uid in supervisors() {
        let r = py_as(uid, &wd, &[], PY_TMPFS);
        expect_out(
            &r,
            &format!(
                "/tmp 0o41777 tmpfs {} x\n/dev/shm 0o41777 tmpfs {} x\nTMPDIR /tmp\n",
                256 * MIB,
                64 * MIB
            ),
        );
        let flags = ["--tmp-size", "8MiB", "--shm-size", "4MiB"];
        let r = py_as(uid, &wd, &flags, PY_TMPFS);
        expect_out(
            &r,
            &format!(
                "/tmp 0o41777 tmpfs {} x\n/dev/shm 0o41777 tmpfs {} x\nTMPDIR /tmp\n",
                8 * MIB,
                4 * MIB
            ),
        );
    }
}

/// A file in /tmp and /dev/shm of one run: a concurrent run does not see it, the host does not,
/// and after the run it is gone (a later run does not see it either).
#[test]
fn temp_files_are_invisible_to_a_concurrent_run_and_gone_after() {
    if !require_root() {
        return;
    }
    let name = format!("osb-ns-marker-{}", unique());
    let wd_a = Workdir::new();
    let code_a = format!(
        r#"
import os, time
for d in ("/tmp", "/dev/shm"):
    open(os.path.join(d, "{name}"), "w").write("a")
print("ready", flush=True)
while not os.path.exists("go"):
    time.sleep(0.01)
"#
    );
    let mut a = Background::start(&wd_a, &[], &["python3", "-c", &code_a]);
    a.expect_line("ready\n");
    let look = format!(
        "{PY_ATTEMPT}\nfor d in ('/tmp', '/dev/shm'):\n    attempt(d, lambda: os.stat(os.path.join(d, '{name}')) and None)\n"
    );
    let wd_b = Workdir::new();
    let b = run(&wd_b, &[], &["python3", "-c", &look]);
    for d in ["/tmp", "/dev/shm"] {
        assert!(
            !Path::new(d).join(&name).exists(),
            "run A's marker is on the host's {d}"
        );
    }
    std::fs::write(wd_a.path().join("go"), "").unwrap();
    let a = a.wait();
    assert_eq!(a.code(), 0, "run A: {}", a.stderr());
    expect_out(&b, "/tmp ENOENT\n/dev/shm ENOENT\n");
    let c = run(&wd_b, &[], &["python3", "-c", &look]);
    expect_out(&c, "/tmp ENOENT\n/dev/shm ENOENT\n");
    for d in ["/tmp", "/dev/shm"] {
        let _ = std::fs::remove_file(Path::new(d).join(&name));
    }
}

/// Filling /dev/shm or /tmp past its size gets ENOSPC after exactly the size in bytes.
#[test]
fn filling_tmp_or_dev_shm_past_its_size_is_enospc() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    for uid in supervisors() {
        let r = py_as(
            uid,
            &wd,
            &["--shm-size", "4MiB", "--tmp-size", "4MiB"],
            r#"
for d in ("/dev/shm", "/tmp"):
    n = 0
    try:
        fd = os.open(os.path.join(d, "fill"), os.O_WRONLY | os.O_CREAT, 0o600)
        chunk = b"\0" * 65536
        while n < (64 << 20):
            n += os.write(fd, chunk)
        print(d, "FILLED", n)
    except OSError as e:
        print(d, errno.errorcode[e.errno], n)
"#,
        );
        expect_out(
            &r,
            &format!("/dev/shm ENOSPC {}\n/tmp ENOSPC {}\n", 4 * MIB, 4 * MIB),
        );
    }
}

/// The pages of /dev/shm are charged to the exec's memory cgroup: with a /dev/shm larger than
/// --memory, filling it ends the run with the memory-limit outcome, not ENOSPC. A fill below
/// --memory is the control: it succeeds.
#[test]
fn dev_shm_bytes_count_toward_memory() {
    if !require_root() {
        return;
    }
    let flags = ["--memory", "64MiB", "--shm-size", "512MiB"];
    let wd = Workdir::new();
    let dd = |count: &str| {
        run(
            &wd,
            &flags,
            &[
                "dd",
                "if=/dev/zero",
                "of=/dev/shm/fill",
                "bs=1M",
                &format!("count={count}"),
            ],
        )
    };
    let ok = dd("16");
    assert_eq!((ok.code(), ok.reason()), (0, "exited"), "{}", ok.stderr());
    let r = dd("256");
    assert_eq!(r.reason(), "memory_limit", "{}\n{}", r.stderr(), r.report);
    assert_ne!(r.code(), 0, "{}", r.report);
}
