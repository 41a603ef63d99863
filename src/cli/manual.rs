//! `openshell-sandbox completions` and `man`'s flags.

use std::path::PathBuf;

use clap::Parser;

use super::common::VERSION;

/// `openshell-sandbox completions SHELL`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox completions",
    bin_name = "openshell-sandbox completions",
    about = "Print a shell completion script on stdout",
    after_help = "bash: openshell-sandbox completions bash > /etc/bash_completion.d/openshell-sandbox\n\
zsh:  openshell-sandbox completions zsh > \"${fpath[1]}/_openshell-sandbox\"\n\
fish: openshell-sandbox completions fish > ~/.config/fish/completions/openshell-sandbox.fish",
    version = VERSION
)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `openshell-sandbox man [--dir DIR]`
#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox man",
    bin_name = "openshell-sandbox man",
    about = "Print the man page (roff) on stdout, or write one page per subcommand to --dir",
    version = VERSION
)]
pub struct ManArgs {
    /// Write openshell-sandbox.1 and openshell-sandbox-SUBCOMMAND.1 into this directory
    /// (made when missing) instead.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}
