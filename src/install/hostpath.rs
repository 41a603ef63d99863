//! `install --dest DIR` and `install --verify`: the binary and its marker under a hostPath.

use std::io;
use std::path::{Path, PathBuf};

use super::dest::{DestDir, Digest256, Existing};
use super::error::InstallError;
use super::self_exe::SelfExe;

/// The file name the pod contract expects under the hostPath (`/opt/openshell/bin/...`).
pub const BINARY_NAME: &str = "openshell-sandbox";
/// The marker written beside the binary.
pub const MARKER_NAME: &str = ".openshell-sandbox.version";

/// What `install` did, printed for the operator.
#[derive(Debug)]
pub(super) struct Report {
    path: PathBuf,
    sha256: Digest256,
    binary: Change,
    marker: Change,
    stale_removed: usize,
}

#[derive(Debug, PartialEq, Eq)]
enum Change {
    Unchanged,
    Created,
    Replaced,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sha = hex::encode(self.sha256);
        let v = env!("CARGO_PKG_VERSION");
        match (&self.binary, &self.marker) {
            (Change::Unchanged, Change::Unchanged) => write!(
                f,
                "{} already holds this binary (version {v}, sha256 {sha}); nothing changed",
                self.path.display()
            ),
            (Change::Unchanged, _) => write!(
                f,
                "{} already holds this binary (version {v}, sha256 {sha}); marker rewritten",
                self.path.display()
            ),
            (Change::Created, _) => write!(
                f,
                "installed {} (version {v}, sha256 {sha})",
                self.path.display()
            ),
            (Change::Replaced, _) => write!(
                f,
                "replaced {} with version {v} (sha256 {sha}); running copies of the old binary keep working",
                self.path.display()
            ),
        }?;
        if self.stale_removed > 0 {
            write!(
                f,
                "; removed {} stale temporary file(s)",
                self.stale_removed
            )?;
        }
        Ok(())
    }
}

fn marker_contents(sha256: &Digest256) -> String {
    format!(
        "version={}\nsha256={}\n",
        env!("CARGO_PKG_VERSION"),
        hex::encode(sha256)
    )
}

pub(super) fn install(
    dest: &Path,
    create_parents: bool,
    me: &SelfExe,
) -> Result<Report, InstallError> {
    let dir = DestDir::open(dest, create_parents)?;
    let stale_removed = dir.remove_stale_temps().len();

    let binary = match dir.inspect(BINARY_NAME)? {
        Existing::Regular { sha256, mode } if sha256 == me.sha256 && mode == 0o755 => {
            Change::Unchanged
        }
        existing => {
            dir.place(BINARY_NAME, &mut me.reader()?, &me.sha256, 0o755)?;
            if existing == Existing::Absent {
                Change::Created
            } else {
                Change::Replaced
            }
        }
    };

    // The marker goes second: a crash in between leaves a stale marker, which `--verify`
    // reports and the next run repairs, never a marker describing a binary not yet there.
    let contents = marker_contents(&me.sha256);
    let want: Digest256 = {
        use sha2::Digest;
        sha2::Sha256::digest(contents.as_bytes()).into()
    };
    let marker = match dir.inspect(MARKER_NAME)? {
        Existing::Regular { sha256, mode } if sha256 == want && mode == 0o644 => Change::Unchanged,
        existing => {
            dir.place(MARKER_NAME, &mut contents.as_bytes(), &want, 0o644)?;
            if existing == Existing::Absent {
                Change::Created
            } else {
                Change::Replaced
            }
        }
    };
    Ok(Report {
        path: dir.join(BINARY_NAME),
        sha256: me.sha256,
        binary,
        marker,
        stale_removed,
    })
}

/// The readiness check: DEST holds this very binary, mode 0755, with a marker that says so.
pub(super) fn verify(dest: &Path, me: &SelfExe) -> Result<(), InstallError> {
    let dir = match DestDir::open(dest, false) {
        Err(InstallError::DestMissing { .. }) => {
            return Err(InstallError::NotInstalled {
                path: dest.join(BINARY_NAME),
            });
        }
        other => other?,
    };
    let path = dir.join(BINARY_NAME);
    match dir.inspect(BINARY_NAME)? {
        Existing::Absent => return Err(InstallError::NotInstalled { path }),
        Existing::Regular { sha256, .. } if sha256 != me.sha256 => {
            return Err(InstallError::Differs {
                path,
                found: hex::encode(sha256),
                expected: hex::encode(me.sha256),
            });
        }
        Existing::Regular { mode, .. } if mode != 0o755 => {
            return Err(InstallError::WrongMode { path, mode });
        }
        Existing::Regular { .. } => {}
    }
    let marker_path = dir.join(MARKER_NAME);
    let want = marker_contents(&me.sha256);
    match std::fs::read_to_string(&marker_path) {
        Ok(found) if found == want => Ok(()),
        Ok(found) => Err(InstallError::MarkerMismatch {
            path: marker_path,
            found,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(InstallError::NotInstalled { path: marker_path })
        }
        Err(source) => Err(InstallError::Inspect {
            path: marker_path,
            source,
        }),
    }
}
