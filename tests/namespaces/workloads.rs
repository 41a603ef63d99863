//! Generated-code workloads, as the unprivileged sandbox uid (65534, or the per-run uid) with the
//! default policy: what failed without a
//! writable /tmp and /dev/shm.

use std::path::Path;

use super::support::{Workdir, require, require_root};
use super::{expect_out, py, run};

#[test]
fn python_multiprocessing_pool_and_process_pool_executor_work() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    let r = py(
        &wd,
        &[],
        r#"
import multiprocessing, concurrent.futures
def sq(x):
    return x * x
print("root", os.getuid() == 0)
with multiprocessing.Pool(2) as p:
    print("pool", sum(p.map(sq, range(10))))
with concurrent.futures.ProcessPoolExecutor(2) as ex:
    print("executor", sum(ex.map(sq, range(10))))
"#,
    );
    expect_out(&r, "root False\npool 285\nexecutor 285\n");
}

const HELLO_C: &str =
    "#include <stdio.h>\nint main(void) { puts(\"hello from gcc\"); return 0; }\n";

#[test]
fn gcc_and_make_work_without_scratch() {
    if !require_root() {
        return;
    }
    let wd = Workdir::new();
    std::fs::write(wd.path().join("hello.c"), HELLO_C).unwrap();
    let r = run(
        &wd,
        &[],
        &[
            "sh",
            "-c",
            "gcc -o hello hello.c && ./hello && [ $(id -u) -ne 0 ] && echo unprivileged",
        ],
    );
    expect_out(&r, "hello from gcc\nunprivileged\n");
    std::fs::write(
        wd.path().join("Makefile"),
        "hello2: hello.c\n\tgcc -O1 -o $@ $<\n",
    )
    .unwrap();
    let r = run(&wd, &[], &["sh", "-c", "make -s && ./hello2"]);
    expect_out(&r, "hello from gcc\n");
}

#[test]
fn node_writes_os_tmpdir() {
    if !require_root() {
        return;
    }
    if !require(
        Path::new("/usr/bin/node").exists(),
        "/usr/bin/node (apt-get install nodejs; .ci/run installs it)",
    ) {
        return;
    }
    let wd = Workdir::new();
    let r = run(
        &wd,
        &[],
        &[
            "node",
            "-e",
            "const fs=require('fs'),os=require('os'),p=require('path');\
             const f=p.join(os.tmpdir(),'n.txt'); fs.writeFileSync(f,'hi');\
             console.log(os.tmpdir(), fs.readFileSync(f,'utf8'));",
        ],
    );
    expect_out(&r, "/tmp hi\n");
}
