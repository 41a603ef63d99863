//! installer/image-rootfs.sh lays out the same root file system as installer/Dockerfile, and
//! refuses what a FROM-scratch image could not run. A static test program stands in for a
//! static build of ours (the test profile builds a dynamic binary).

mod support;

use support::require;
use support::text;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BIN: &str = env!("CARGO_BIN_EXE_openshell-sandbox");

fn script(out: &Path, bin: &Path) -> Output {
    Command::new("bash")
        .arg(format!("{ROOT}/installer/image-rootfs.sh"))
        .arg(out)
        .arg(bin)
        .output()
        .unwrap()
}

/// A statically linked executable built with the C compiler, or None when that cannot be done.
fn static_program(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("hello.c");
    fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let out = dir.join("hello-static");
    let ok = Command::new("cc")
        .arg("-static")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then_some(out)
}

#[test]
fn the_dockerfile_is_from_scratch_with_only_the_binary() {
    let df = fs::read_to_string(format!("{ROOT}/installer/Dockerfile")).unwrap();
    let instructions: Vec<&str> = df
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        instructions,
        [
            "FROM scratch",
            "COPY --chmod=0555 openshell-sandbox /openshell-sandbox",
            r#"ENTRYPOINT ["/openshell-sandbox"]"#,
        ]
    );
}

#[test]
fn rootfs_holds_exactly_the_static_binary_like_the_image() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(prog) = static_program(tmp.path()) else {
        assert!(!require(
            false,
            "needs cc with static libc (libc6-dev) to make a static ELF"
        ));
        return;
    };
    let out = tmp.path().join("rootfs");
    let o = script(&out, &prog);
    assert!(o.status.success(), "{}", text(&o.stderr));

    let entries: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(entries, ["openshell-sandbox"]);
    let meta = fs::metadata(out.join("openshell-sandbox")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o555);
    assert_eq!(
        fs::read(out.join("openshell-sandbox")).unwrap(),
        fs::read(&prog).unwrap()
    );
    assert!(
        Command::new(out.join("openshell-sandbox"))
            .status()
            .unwrap()
            .success()
    );
    // No staging directory left beside it.
    let beside: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".image-rootfs."))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");

    // An existing, non-empty OUT_DIR is never mixed with the image.
    let again = script(&out, &prog);
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again.stderr).contains("is not empty"));

    // An empty existing directory is fine.
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert!(script(&empty, &prog).status.success());
}

#[test]
fn rootfs_refuses_a_dynamic_binary_and_other_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("rootfs");

    // The test build of openshell-sandbox is dynamically linked.
    let o = script(&out, Path::new(BIN));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("dynamically linked"),
        "{}",
        text(&o.stderr)
    );
    assert!(!out.exists(), "nothing may be left on refusal");

    let not_elf = tmp.path().join("script.sh");
    fs::write(&not_elf, "#!/bin/sh\n").unwrap();
    assert!(text(&script(&out, &not_elf).stderr).contains("not an ELF file"));
    assert!(text(&script(&out, &tmp.path().join("nope")).stderr).contains("does not exist"));

    let usage = Command::new("bash")
        .arg(format!("{ROOT}/installer/image-rootfs.sh"))
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(1));
    assert!(text(&usage.stderr).contains("usage:"));
    assert!(fs::read_dir(tmp.path()).unwrap().all(|e| {
        !e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".image-rootfs.")
    }));
}
