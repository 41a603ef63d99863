//! The top level: the subcommands for `--help` and `help`, the short usage of a bare
//! `openshell-sandbox`, and the nearest subcommand to a typo.

use clap::{Parser, Subcommand};

use super::common::VERSION;

/// The subcommands, for the top-level `--help` and `help`. Each parses its own flags (see
/// `main.rs`); this enum only names and describes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Run one command under the full sandbox, streaming its output
    Run,
    /// Say whether a policy is enforceable on this kernel; --explain prints its rules
    Check,
    /// Run the pod supervisor: dial the OpenShell gateway and serve exec (also: a flag first)
    Serve,
    /// Copy this binary atomically into a hostPath directory (node installer)
    Install,
    /// OpenShell's init-container contract: copy this binary to DEST
    CopySelf,
    /// Generate the mTLS CA, server and client certificates
    Certs,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions,
    /// Print the man page, or write every page to a directory (--dir)
    Man,
    /// Print this help, or the help of one subcommand
    Help,
}

impl Command {
    /// Every subcommand word, in help order.
    pub const WORDS: &[&str] = &[
        "run",
        "check",
        "serve",
        "install",
        "copy-self",
        "certs",
        "completions",
        "man",
        "help",
    ];
}

/// The top level, for `openshell-sandbox --help` only.
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox",
    bin_name = "openshell-sandbox",
    about = "Sandbox supervisor for OpenShell: run generated code under Landlock, seccomp, rlimits, cgroups and an unprivileged uid",
    version = VERSION,
    disable_help_subcommand = true,
    after_help = "With flags only, the binary is the pod supervisor (`serve`), as a sandbox pod \
starts it. With a gateway configured (OPENSHELL_ENDPOINT), no arguments at all is the supervisor \
too, and a first word that is no subcommand is the main process's command, as in OpenShell.\n\n\
`openshell-sandbox help SUBCOMMAND` or `openshell-sandbox SUBCOMMAND --help` shows its flags.\n\n\
Exit codes: 125 for a usage error or a failure of openshell-sandbox itself; `run` otherwise \
exits with its command's code (see `run --help`)."
)]
pub struct TopArgs {
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What a bare `openshell-sandbox` prints when no gateway is configured: there is nothing to
/// supervise, so it is a person trying the binary.
pub const SHORT_USAGE: &str = "\
usage: openshell-sandbox run [OPTIONS] [--] CMD [ARGS]...   run one command in the sandbox
       openshell-sandbox check [OPTIONS]                   what this kernel can enforce
       openshell-sandbox --help                            every subcommand

As a sandbox pod's supervisor it needs a gateway: set OPENSHELL_ENDPOINT (see `serve --help`).";

/// The subcommand word nearest to `word`, when it is near enough to be a typo of it.
pub fn nearest_subcommand(word: &str) -> Option<&'static str> {
    let (best, d) = Command::WORDS
        .iter()
        .map(|w| (*w, edit_distance(word, w)))
        .min_by_key(|(_, d)| *d)?;
    // A transposition (`rnu`) costs 2 here; allow up to a third of the word on top of that.
    (d <= 2.max(best.len() / 3)).then_some(best)
}

/// Levenshtein distance (insert, delete, substitute), by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}
