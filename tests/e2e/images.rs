//! Root filesystems built during the test, and the node.
//!
//! - The sandbox image: Debian's static busybox, its applet symlinks and the directories a pod
//!   has. No libc, no loader: only a static supervisor can run in it.
//! - The python variant: the same plus the host's python3, its standard library and exactly the
//!   shared libraries `ldd` says it and its extension modules need, so generated code can run.
//! - The installer image: `installer/image-rootfs.sh`, the FROM-scratch layout of the real image.
//! - The node: a directory standing for the node's root, where the DaemonSet's hostPath lives.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

pub const BUSYBOX: &str = "/bin/busybox";
pub const HOST_PYTHON: &str = "/usr/bin/python3";

/// The hostPath of the v0.0.36 sandbox pod (and of our DaemonSet).
pub const HOST_PATH: &str = "opt/openshell/bin";
/// Where the node installer's container mounts the hostPath.
pub const INSTALLER_MOUNT: &str = "/host/opt/openshell/bin";
pub const BINARY: &str = "openshell-sandbox";
pub const MARKER: &str = ".openshell-sandbox.version";

fn mkdir(p: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::create_dir_all(p).with_context(|| format!("mkdir {}", p.display()))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", p.display()))
}

/// PT_INTERP in an ELF64 little-endian executable's program headers?
pub fn has_interpreter(path: &Path) -> anyhow::Result<bool> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 {
        bail!("{} is not an ELF64 file", path.display());
    }
    let u16_at = |o: usize| usize::from(u16::from_le_bytes([elf[o], elf[o + 1]]));
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into()?) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    Ok((0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        elf.get(o..o + 4) == Some(&3u32.to_le_bytes()[..]) // PT_INTERP
    }))
}

/// The busybox sandbox image.
pub fn busybox_rootfs(root: &Path) -> anyhow::Result<()> {
    if has_interpreter(Path::new(BUSYBOX))? {
        bail!("{BUSYBOX} is dynamically linked; install Debian's busybox-static package");
    }
    mkdir(root, 0o755)?;
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "home", "var", "run",
        "sandbox",
    ] {
        mkdir(&root.join(d), 0o755)?;
    }
    mkdir(&root.join("tmp"), 0o1777)?;
    mkdir(&root.join("root"), 0o700)?;
    let bb = root.join("bin/busybox");
    std::fs::copy(BUSYBOX, &bb).context("copying busybox")?;
    std::fs::set_permissions(&bb, std::fs::Permissions::from_mode(0o755))?;
    let out = Command::new(BUSYBOX)
        .arg("--list-full")
        .output()
        .context("busybox --list-full")?;
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let link = root.join(applet.trim_start_matches('/'));
        if applet.is_empty() || link == bb {
            continue;
        }
        std::fs::create_dir_all(link.parent().unwrap())?;
        std::os::unix::fs::symlink("/bin/busybox", &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    if !root.join("bin/sh").exists() {
        bail!("busybox --list-full did not include bin/sh");
    }
    // What the busybox image ships: root and nobody (the sandbox's default uid, 65534).
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n",
    )?;
    std::fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    for f in ["etc/passwd", "etc/group"] {
        std::fs::set_permissions(root.join(f), std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// Regular files in the image (relative paths): proves what is, and is not, in it.
pub fn regular_files(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push(e.path().strip_prefix(root)?.display().to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Add the host's python3 to a busybox image: the interpreter, its standard library, and the
/// shared libraries (and loader) that `ldd` lists for it and its extension modules.
pub fn add_python(root: &Path) -> anyhow::Result<String> {
    let py = Path::new(HOST_PYTHON)
        .canonicalize()
        .with_context(|| format!("{HOST_PYTHON} (install python3)"))?;
    let ver = py
        .file_name()
        .and_then(|n| n.to_str())
        .context("python3's real file name")?
        .to_owned();
    let stdlib = Path::new("/usr/lib").join(&ver);
    if !stdlib.join("os.py").exists() {
        bail!(
            "{} has no os.py; {HOST_PYTHON} is not a Debian-layout python",
            stdlib.display()
        );
    }
    let dst = root.join("usr/bin").join(&ver);
    std::fs::copy(&py, &dst).context("copying python")?;
    std::os::unix::fs::symlink(&ver, root.join("usr/bin/python3"))?;
    // Test suites and GUI/tooling packages are not needed to run code.
    let skip: BTreeSet<&str> = [
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
    ]
    .into();
    copy_tree(&stdlib, &root.join(stdlib.strip_prefix("/")?), &|p| {
        p.parent() == Some(&stdlib)
            && p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| skip.contains(n) || n.starts_with("config-"))
    })?;

    let mut objects = vec![py.clone()];
    if let Ok(rd) = std::fs::read_dir(stdlib.join("lib-dynload")) {
        objects.extend(
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "so")),
        );
    }
    let out = Command::new("ldd")
        .args(&objects)
        .output()
        .context("running ldd")?;
    let mut libs = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim().split(" (").next().unwrap_or(""),
            None if line.starts_with('/') && line.contains(" (0x") => {
                line.split(" (").next().unwrap_or("")
            }
            None => "",
        };
        if path.starts_with('/') {
            libs.insert(PathBuf::from(path));
        }
    }
    if !libs.iter().any(|l| l.to_string_lossy().contains("libc.so")) {
        bail!("ldd listed no libc for {}", py.display());
    }
    for lib in &libs {
        let to = root.join(lib.strip_prefix("/")?);
        std::fs::create_dir_all(to.parent().unwrap())?;
        // Follows symlinks: the image gets the file under the name the loader asks for.
        std::fs::copy(lib, &to).with_context(|| format!("copying {}", lib.display()))?;
    }
    Ok(ver)
}

/// Copy a tree, following symlinks (a link out of the tree, such as Debian's sitecustomize.py,
/// becomes the file it names, or is left out when it names nothing).
fn copy_tree(src: &Path, dst: &Path, skip: &dyn Fn(&Path) -> bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let p = e?.path();
        if skip(&p) {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        let to = dst.join(p.file_name().unwrap());
        if meta.is_dir() {
            copy_tree(&p, &to, skip)?;
        } else if meta.is_file() {
            std::fs::copy(&p, &to).with_context(|| format!("copying {}", p.display()))?;
        }
    }
    Ok(())
}

/// The installer image's root filesystem, laid out by the installer branch's own script.
pub fn installer_image(out: &Path, binary: &Path) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("installer/image-rootfs.sh");
    let o = Command::new("bash")
        .arg(&script)
        .arg(out)
        .arg(binary)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !o.status.success() {
        bail!(
            "{} {} {} failed: {}",
            script.display(),
            out.display(),
            binary.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

/// A node: `dir` stands for its root file system.
pub struct Node {
    /// `<node>/opt/openshell/bin`.
    pub host_path: PathBuf,
}

impl Node {
    /// kubelet's `hostPath` type `DirectoryOrCreate`: the directory, mode 0755, owned by root.
    pub fn new(dir: &Path) -> anyhow::Result<Node> {
        let host_path = dir.join(HOST_PATH);
        mkdir(&host_path, 0o755)?;
        Ok(Node { host_path })
    }

    pub fn binary(&self) -> PathBuf {
        self.host_path.join(BINARY)
    }

    /// The `sha256=` line of the installer's marker.
    pub fn marker_sha(&self) -> anyhow::Result<String> {
        let m = std::fs::read_to_string(self.host_path.join(MARKER))
            .with_context(|| format!("reading the marker {MARKER}"))?;
        m.lines()
            .find_map(|l| l.strip_prefix("sha256="))
            .map(str::to_owned)
            .with_context(|| format!("no sha256= line in the marker:\n{m}"))
    }
}

pub fn sha256_file(p: &Path) -> anyhow::Result<String> {
    use sha2::Digest;
    let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    Ok(hex::encode(sha2::Sha256::digest(&bytes)))
}
