//! [`RunError`]: why a run could not start, or why the sandbox refused, each with the exit
//! code a launcher gives it.

use std::io;
use std::path::PathBuf;

use super::{egress_error, manager, missing_interpreter, report_file, workdir};
use crate::exit::Exit;
use crate::policy::PolicyError;
use crate::sandbox::{ChildError, PrepareError};

/// Why a run could not start (or the sandbox refused). Each maps to a launcher exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}: command not found")]
    NotFound(String),
    /// A path no grant covers: it cannot exist in the view, whatever the host holds there.
    #[error(
        "{}: command not found: the sandbox's view holds only the granted paths, and none covers it (`--ro DIR`, or read_only in a policy file, grants a directory)",
        program.display()
    )]
    NotInView { program: PathBuf },
    #[error("{path}: cannot execute: {source}")]
    NotExecutable { path: PathBuf, source: io::Error },
    /// The program, or an interpreter it needs, is a FIFO, a device, a directory or a socket.
    #[error(
        "{}: cannot execute: {}{} is {what}, not a program file",
        program.display(),
        if subject == program { "" } else { "its interpreter " },
        subject.display()
    )]
    NotAProgram {
        program: PathBuf,
        subject: PathBuf,
        what: &'static str,
    },
    /// execve was refused although the mode of every file and directory allows it: Landlock
    /// grants no execute right there, or the file lies on a noexec mount.
    #[error(
        "{}: cannot execute: {source}: {} may be executed by its mode, but {}",
        program.display(),
        subject.display(),
        if *noexec { "it lies on a noexec mount" } else { "the sandbox's Landlock rules grant no execute right there" }
    )]
    Refused {
        program: PathBuf,
        /// The program itself, or the interpreter that was refused.
        subject: PathBuf,
        noexec: bool,
        source: io::Error,
    },
    /// execve was refused by the file permissions: the sandbox uid may not search a directory
    /// on the way, or execute the file. Granting it (`--ro`) would not help.
    #[error(
        "{}: cannot execute: {source}: the sandbox uid {uid} may not {} {} by its permissions (owner {owner}, mode {mode:04o}); `--ro` would not help: make it accessible to that uid, or pick --uid",
        program.display(),
        if *search { "search" } else { "execute" },
        blocker.display()
    )]
    NotPermitted {
        program: PathBuf,
        /// The file (the program or an interpreter), or the directory on its way, that the uid
        /// lacks execute/search on.
        blocker: PathBuf,
        /// `blocker` is a directory on the way.
        search: bool,
        uid: u32,
        owner: u32,
        mode: u32,
        source: io::Error,
    },
    /// The program file has no execute bit at all (a script saved with mode 0644): the fix is
    /// the bit, or naming its interpreter, never another uid.
    #[error(
        "{}: cannot execute: {source}: it has no execute bit (mode {mode:04o}): make it executable (`chmod +x {shown}`), or run it with its interpreter ({})",
        program.display(),
        match interpreter {
            Some(i) => format!("`{i} {shown}`"),
            None => format!("e.g. `sh {shown}` for a shell script"),
        }
    )]
    NoExecuteBit {
        program: PathBuf,
        /// The command as it was given, for the suggested fixes.
        shown: String,
        mode: u32,
        /// The interpreter the file's name suggests (`python3` for `*.py`).
        interpreter: Option<&'static str>,
        source: io::Error,
    },
    /// The program is in the view, but an interpreter it needs (ELF `PT_INTERP` or `#!`) is not.
    #[error("{0}")]
    InterpreterNotFound(Box<missing_interpreter::MissingInterpreter>),
    #[error("--policy {}: {source}", path.display())]
    PolicyFile {
        path: PathBuf,
        source: crate::policy::openshell::YamlError,
    },
    #[error("--policy {}: {source}{}", path.display(), run_hint(source))]
    PolicyMap {
        path: PathBuf,
        source: crate::policy::openshell::MapError,
    },
    #[error("{0}")]
    Workdir(Box<workdir::NotWritable>),
    #[error("invalid policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("sandbox refused: {0}")]
    Prepare(#[from] PrepareError),
    #[error("sandbox setup failed in the child: {0}")]
    ChildSetup(ChildError),
    #[error("starting the exec: {0}")]
    Manager(manager::ManagerError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Egress(#[from] egress_error::EgressError),
    #[error("choosing the run's uid (pass --uid to name one): {0}")]
    Identity(crate::sandbox::identity::LeaseError),
    #[error("{0}")]
    Hold(workdir::HoldError),
    #[error("--report-json {path}: {source}")]
    ReportJson {
        path: PathBuf,
        source: Box<report_file::ReportFileError>,
    },
    /// The run ended, but its report could not be put at the path (nothing is left there).
    #[error("--report-json {path}: the run ended, but its report could not be written: {source}")]
    ReportWrite {
        path: PathBuf,
        source: Box<report_file::ReportFileError>,
    },
}

/// What lets `run` or `check` keep a policy file it refuses, where flags can.
fn run_hint(e: &crate::policy::openshell::MapError) -> &'static str {
    match e {
        crate::policy::openshell::MapError::NetworkRules(_) => {
            ". To run it anyway, replace the file's network section with an explicit \
             `--network none` (loopback only) or `--network all` (the host's network), or \
             remove network_policies from the file"
        }
        _ => "",
    }
}

impl RunError {
    /// Which row of the exit-code table (`crate::exit`) this is, as docker's launcher says it:
    /// not found, not executable, or ours for everything else (invalid input, a policy we
    /// cannot keep, an unusable workdir, a refused layer, a failed setup), so that it cannot
    /// be taken for the command's own code.
    pub fn exit(&self) -> Exit {
        match self {
            RunError::NotFound(_)
            | RunError::NotInView { .. }
            | RunError::InterpreterNotFound(_) => Exit::NotFound,
            RunError::NotExecutable { .. }
            | RunError::NotAProgram { .. }
            | RunError::Refused { .. }
            | RunError::NotPermitted { .. }
            | RunError::NoExecuteBit { .. } => Exit::NotExecutable,
            _ => Exit::Ours,
        }
    }

    /// [`Self::exit`]'s code.
    pub fn exit_code(&self) -> u8 {
        self.exit().code()
    }
}
