//! `copy-self DEST`: the same safe copy as `install`, without a marker, parents created, and
//! DEST may name a directory.

use std::path::{Path, PathBuf};

use super::dest::{DestDir, Existing};
use super::error::InstallError;
use super::hostpath::BINARY_NAME;
use super::self_exe::{SELF_EXE, SelfExe};

pub(super) fn copy_self(dest: &Path, me: &SelfExe) -> Result<PathBuf, InstallError> {
    let (dir, name) = if dest.is_dir() {
        (dest.to_path_buf(), own_file_name())
    } else {
        let name = dest
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
            .ok_or_else(|| InstallError::DestNotDirectory { path: dest.into() })?;
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        (parent, name)
    };
    let dir = DestDir::open(&dir, true)?;
    match dir.inspect(&name)? {
        Existing::Regular { sha256, mode } if sha256 == me.sha256 && mode == 0o755 => {}
        _ => dir.place(&name, &mut me.reader()?, &me.sha256, 0o755)?,
    }
    Ok(dir.join(&name))
}

/// Our own file name, as OpenShell's contract asks for a directory DEST.
fn own_file_name() -> String {
    std::fs::read_link(SELF_EXE)
        .ok()
        .and_then(|p| {
            let s = p.file_name()?.to_str()?.to_owned();
            // The kernel appends this when the file we run from was replaced.
            Some(s.strip_suffix(" (deleted)").map(str::to_owned).unwrap_or(s))
        })
        .unwrap_or_else(|| BINARY_NAME.to_owned())
}
