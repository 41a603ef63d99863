//! The floor of a private view (floor.c beside this file), built for a bench run: the least
//! that the kernel charges for the view's namespaces and mounts alone on this machine, which
//! no sandbox with that view can go below. Shared by benches/run.rs and benches/corpus.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compile floor.c (static, -O2) into `dir`; the binary's path.
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/floor/floor.c");
    let out = dir.join("floor");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-O2", "-static", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .map_err(|e| format!("{cc}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{cc} {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(out)
}
