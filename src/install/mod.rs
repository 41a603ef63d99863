//! Copy-to-hostPath: put this binary on the node for sandbox pods to mount read-only.
//!
//! `install --dest DIR` copies the running executable to `DIR/openshell-sandbox` the way
//! Firecracker's jailer copies its binary (see [`dest`]), then records what it installed in
//! `DIR/.openshell-sandbox.version`, written the same way. A rerun with the same binary
//! changes nothing. `--wait` keeps the process up afterwards as a DaemonSet's main container
//! (PID 1: SIGTERM ends it with 0, orphans are reaped), and `--verify` is its readiness check.
//!
//! `copy-self DEST` is OpenShell's init-container contract (v0.0.37+): same safe copy, no
//! marker, parents created, DEST may name a directory.

mod dest;
mod error;
mod wait;

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use dest::{DestDir, Digest256, Existing, sha256_of};
pub use error::InstallError;

/// The file name the pod contract expects under the hostPath (`/opt/openshell/bin/...`).
pub const BINARY_NAME: &str = "openshell-sandbox";
/// The marker written beside the binary.
pub const MARKER_NAME: &str = ".openshell-sandbox.version";
const SELF_EXE: &str = "/proc/self/exe";

#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox install",
    bin_name = "openshell-sandbox install",
    about = "Copy this binary atomically into a hostPath directory (the node installer)",
    version = crate::cli::VERSION
)]
struct InstallArgs {
    /// Directory to install into; the binary lands at DEST/openshell-sandbox.
    #[arg(long, value_name = "DIR")]
    dest: PathBuf,
    /// Create DEST and its missing parents (mode 0755).
    #[arg(long)]
    create_parents: bool,
    /// After installing, stay running until SIGTERM (a DaemonSet main container; PID 1 safe).
    #[arg(long, conflicts_with = "verify")]
    wait: bool,
    /// Change nothing; exit 0 only if DEST holds exactly this binary and a matching marker.
    #[arg(long)]
    verify: bool,
}

/// `install`'s flags, for completions and man pages.
pub fn command() -> clap::Command {
    InstallArgs::command()
}

/// `copy-self`'s one argument, for completions and man pages (`copy_self_main` parses it by
/// hand: OpenShell's contract matches the raw argv).
pub fn copy_self_command() -> clap::Command {
    clap::Command::new("copy-self")
        .about("OpenShell's init-container contract: copy this binary to DEST")
        .long_about(
            COPY_SELF_USAGE
                .split_once('\n')
                .map(|(_, rest)| rest.trim().to_owned())
                .unwrap_or_default(),
        )
        .arg(
            clap::Arg::new("DEST")
                .required(true)
                .value_hint(clap::ValueHint::AnyPath),
        )
}

/// `openshell-sandbox install ...`; `argv[0]` is `install`.
pub fn main(argv: &[OsString]) -> Result<ExitCode, InstallError> {
    let args = crate::cli::parsed_or_exit(InstallArgs::try_parse_from(argv), argv);
    let me = SelfExe::open()?;
    if args.verify {
        verify(&args.dest, &me)?;
        println!(
            "{} matches this binary (sha256 {})",
            args.dest.join(BINARY_NAME).display(),
            hex::encode(me.sha256)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let report =
        install(&args.dest, args.create_parents, &me).map_err(|source| InstallError::Install {
            dest: args.dest.clone(),
            source: Box::new(source),
        })?;
    println!("{report}");
    if args.wait {
        return wait::until_terminated();
    }
    Ok(ExitCode::SUCCESS)
}

/// The running executable, opened once and hashed.
struct SelfExe {
    file: File,
    sha256: Digest256,
}

impl SelfExe {
    fn open() -> Result<Self, InstallError> {
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
    fn reader(&self) -> Result<impl io::Read + '_, InstallError> {
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

/// What `install` did, printed for the operator.
#[derive(Debug)]
struct Report {
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

fn install(dest: &Path, create_parents: bool, me: &SelfExe) -> Result<Report, InstallError> {
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
fn verify(dest: &Path, me: &SelfExe) -> Result<(), InstallError> {
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

const COPY_SELF_USAGE: &str = "usage: openshell-sandbox copy-self DEST\n\
    Copies this executable to DEST (or DEST/openshell-sandbox when DEST is a directory),\n\
    creating parent directories, mode 0755.";

/// `openshell-sandbox copy-self DEST`; `args` are the words after `copy-self`.
pub fn copy_self_main(args: &[OsString]) -> Result<ExitCode, InstallError> {
    let dest = match args {
        [d] if d != "-h" && d != "--help" && !d.is_empty() => PathBuf::from(d),
        [h] if h == "-h" || h == "--help" => {
            println!("{COPY_SELF_USAGE}");
            return Ok(ExitCode::SUCCESS);
        }
        _ => {
            eprintln!("openshell-sandbox copy-self: expected exactly one DEST\n{COPY_SELF_USAGE}");
            return Ok(ExitCode::from(crate::cli::USAGE_EXIT));
        }
    };
    let me = SelfExe::open()?;
    let target = copy_self(&dest, &me).map_err(|source| InstallError::CopySelf {
        dest: dest.clone(),
        source: Box::new(source),
    })?;
    println!(
        "copied to {} (sha256 {})",
        target.display(),
        hex::encode(me.sha256)
    );
    Ok(ExitCode::SUCCESS)
}

fn copy_self(dest: &Path, me: &SelfExe) -> Result<PathBuf, InstallError> {
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
