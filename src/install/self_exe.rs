//! The running executable, the one thing every subcommand here copies or compares.

use std::fs::File;
use std::io;
use std::path::PathBuf;

use super::dest::{Digest256, sha256_of};
use super::error::InstallError;

/// The kernel's link to the running executable.
pub(super) const SELF_EXE: &str = "/proc/self/exe";

/// The running executable, opened once and hashed.
pub(super) struct SelfExe {
    file: File,
    pub(super) sha256: Digest256,
}

impl SelfExe {
    pub(super) fn open() -> Result<Self, InstallError> {
        let path = PathBuf::from(SELF_EXE);
        // /proc/self/exe names the inode we are running even if our path was since replaced.
        let mut file = File::open(&path).map_err(|source| InstallError::OpenSelf {
            path: path.clone(),
            source,
        })?;
        let sha256 = sha256_of(&mut file).map_err(|source| InstallError::ReadSelf {
            path: path.clone(),
            source,
        })?;
        Ok(Self { file, sha256 })
    }

    /// A reader positioned at the start of the executable.
    pub(super) fn reader(&self) -> Result<impl io::Read + '_, InstallError> {
        use std::io::Seek;
        let mut f = &self.file;
        f.seek(io::SeekFrom::Start(0))
            .map_err(|source| InstallError::ReadSelf {
                path: SELF_EXE.into(),
                source,
            })?;
        Ok(f)
    }
}
