//! The whole command tree, for shell completions (clap_complete) and man pages (clap_mangen).
//!
//! Each subcommand parses its own flags (main.rs dispatches by the first word), so no single
//! clap definition holds them all: this module assembles one from the top-level help's list
//! and each subcommand's own parser. It sits above every subcommand module for that reason.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::{self, CompletionsArgs, ManArgs};

/// Every subcommand with its real flags, under the top level's name, about and version.
pub fn command_tree() -> clap::Command {
    let top = cli::TopArgs::command();
    let mut tree = clap::Command::new(BIN)
        .bin_name(BIN)
        .version(cli::VERSION)
        .about(top.get_about().cloned().unwrap_or_default())
        .after_help(top.get_after_help().cloned().unwrap_or_default())
        .disable_help_subcommand(true);
    for &name in cli::Command::WORDS {
        let Some(sub) = top.find_subcommand(name) else {
            continue;
        };
        let real = match name {
            "run" => cli::RunArgs::command(),
            "check" => cli::CheckArgs::command(),
            "serve" => crate::gateway::config::ServeArgs::command(),
            "install" => crate::install::command(),
            "copy-self" => crate::install::copy_self_command(),
            "certs" => crate::certs::command(),
            "completions" => CompletionsArgs::command(),
            "man" => ManArgs::command(),
            "help" => clap::Command::new("help").arg(
                clap::Arg::new("subcommand")
                    .value_name("SUBCOMMAND")
                    .value_parser(clap::builder::PossibleValuesParser::new(
                        cli::Command::WORDS.iter().filter(|w| **w != "help"),
                    )),
            ),
            _ => sub.clone(),
        };
        tree = tree.subcommand(
            real.name(name)
                .bin_name(format!("{BIN} {name}"))
                .display_name(format!("{BIN}-{name}"))
                .about(sub.get_about().cloned().unwrap_or_default()),
        );
    }
    tree
}

/// Why `completions` or `man` failed.
#[derive(Debug, thiserror::Error)]
pub enum ManualError {
    #[error("writing the man pages into {}", dir.display())]
    WriteDir {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("rendering the man page")]
    Render(#[source] std::io::Error),
    #[error("writing to stdout")]
    Stdout(#[source] std::io::Error),
}

/// `openshell-sandbox completions SHELL`: the script on stdout.
pub fn completions(args: &CompletionsArgs) -> Result<ExitCode, ManualError> {
    let mut tree = command_tree();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut tree, BIN, &mut out);
    if args.shell == clap_complete::Shell::Bash {
        out = fix_bash_states(&out);
    }
    write_stdout(&out)
}

const BIN: &str = "openshell-sandbox";

/// clap_complete's bash script tracks the subcommand typed so far as a state: its loop spells
/// `run`'s `openshell__sandbox__subcmd__run` (each word escaped alone), while its case arms
/// escape the whole path at once and spell the bin name's hyphen as the word separator
/// (`openshell__subcmd__sandbox__subcmd__run`). No arm matched, so no subcommand's flags
/// completed; spell the arms as the loop does.
fn fix_bash_states(script: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(script)
        .replace(
            "openshell__subcmd__sandbox__subcmd__",
            "openshell__sandbox__subcmd__",
        )
        .into_bytes()
}

/// `openshell-sandbox man [--dir DIR]`: the top page on stdout, or every page into DIR.
pub fn man(args: &ManArgs) -> Result<ExitCode, ManualError> {
    let tree = command_tree();
    match &args.dir {
        Some(dir) => {
            let failed = |source| ManualError::WriteDir {
                dir: dir.clone(),
                source,
            };
            // Made when missing, as `install -d` or `cargo doc` make their output directory.
            std::fs::create_dir_all(dir).map_err(failed)?;
            // One page for the top level, one per subcommand (openshell-sandbox-run.1, ...),
            // as git and cargo lay theirs out.
            clap_mangen::generate_to(tree, dir).map_err(failed)?;
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(tree)
                .render(&mut out)
                .map_err(ManualError::Render)?;
            write_stdout(&out)
        }
    }
}

/// A closed pipe (`| head`) is no error of ours; anything else is.
fn write_stdout(bytes: &[u8]) -> Result<ExitCode, ManualError> {
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(ManualError::Stdout(e)),
        _ => Ok(ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tree_holds_every_subcommand_with_its_flags() {
        let tree = super::command_tree();
        tree.clone().debug_assert();
        let names: Vec<&str> = tree.get_subcommands().map(|c| c.get_name()).collect();
        assert_eq!(names, crate::cli::Command::WORDS);
        let run = tree.find_subcommand("run").unwrap();
        assert!(run.get_arguments().any(|a| a.get_long() == Some("timeout")));
        let serve = tree.find_subcommand("serve").unwrap();
        assert!(
            serve
                .get_arguments()
                .any(|a| a.get_long() == Some("endpoint"))
        );
    }
}
