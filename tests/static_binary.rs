//! The release binary is fully static: no ELF interpreter, and it runs `check` (and a
//! sandboxed `run`) inside a root filesystem that holds nothing but itself.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::*;

/// The static build (`make static` exports its path as OSB_STATIC_BIN).
/// Enter ROOT as a container runtime would: a mount namespace of its own, ROOT a mount point
/// made the root with pivot_root (not chroot: a process that joins a mount namespace, as the
/// sandbox view's init does, gets that namespace's root, which chroot does not change), and a
/// fresh /proc. The host's root stays reachable below /.oldroot (there is no umount in a
/// libc-less image to detach it); the sandbox's Landlock rules never grant it.
fn chroot(root: &std::path::Path) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            r#"mount --bind "$0" "$0" && mount -t proc proc "$0/proc" && mkdir -p "$0/.oldroot" && cd "$0" && pivot_root . .oldroot && cd / && exec "$@""#,
        )
        .arg(root);
    c
}

fn static_bin() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("OSB_STATIC_BIN")?);
    p.exists().then_some(p)
}

/// PT_INTERP present in the program headers of an ELF64 little-endian file?
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not ELF64");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

#[test]
fn static_binary_has_no_interpreter_and_runs_without_libc() {
    let Some(bin) = static_bin() else {
        require(
            false,
            "OSB_STATIC_BIN (run `make static` first, or use `make test`)",
        );
        return;
    };
    let elf = std::fs::read(&bin).unwrap();
    assert!(
        !has_interpreter(&elf),
        "{} has a PT_INTERP header",
        bin.display()
    );
    // The debug build is dynamic, which proves the ELF check can tell the difference.
    assert!(has_interpreter(&std::fs::read(BIN).unwrap()));

    if !require_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::copy(&bin, root.path().join("openshell-sandbox")).unwrap();
    std::fs::create_dir(root.path().join("work")).unwrap();
    // A container runtime mounts /proc in every image; the sandbox view needs it (the
    // namespaces are held through /proc/PID/ns).
    std::fs::create_dir(root.path().join("proc")).unwrap();
    // Every image has /tmp and /dev/shm (mount points for the view's private tmpfs).
    std::fs::create_dir(root.path().join("tmp")).unwrap();
    std::fs::create_dir_all(root.path().join("dev/shm")).unwrap();
    std::os::unix::fs::chown(root.path().join("work"), Some(65534), Some(65534)).unwrap();
    // Nothing else (the binary, /work, the /proc, /tmp and /dev/shm mount points): no /lib, no
    // /usr, no libc, no loader.
    let entries: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
    assert_eq!(entries.len(), 5);

    let out = chroot(root.path())
        .args(["/openshell-sandbox", "check", "--json"])
        .output()
        .expect("chroot");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        report["landlock"]["abi"].as_i64().map(|a| a >= 1),
        Some(true),
        "{report}"
    );
    assert_eq!(report["seccomp"], true);

    // A sandboxed run inside the libc-less root: the binary execs itself under every layer.
    let out = chroot(root.path())
        .args([
            "/openshell-sandbox",
            "run",
            "--workdir",
            "/work",
            "--ro",
            "/openshell-sandbox",
            // The chroot has no /run for the per-run uid locks: an explicit uid.
            "--uid",
            "65534",
            "--",
            "/openshell-sandbox",
            "check",
            "--json",
        ])
        .output()
        .expect("chroot");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let inner: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // Inside, the binary sees itself as the sandbox sees it: uid 65534, no capabilities.
    assert_eq!(inner["euid"], 65534, "{inner}");
    assert_eq!(inner["capabilities"], serde_json::json!([]));
}
