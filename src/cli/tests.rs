//! Unit tests of the command-line definitions (`cli/`).

use std::ffi::OsString;

use clap::{CommandFactory, Parser};

use super::common::{IDENTITY, ISOLATION, LIMITS, OUTPUT, REPORTING};
use super::values::*;
use super::*;
use crate::policy::NetworkMode;

#[test]
fn env_pairs_are_validated() {
    assert_eq!(parse_env_pair("A=b=c").unwrap(), ("A".into(), "b=c".into()));
    assert!(
        parse_env_pair("noequals")
            .unwrap_err()
            .contains("missing `=`")
    );
    assert!(parse_env_pair("=x").unwrap_err().contains("empty"));
    assert!(parse_env_pair("1A=x").unwrap_err().contains("not a valid"));
}

#[test]
fn counts_reject_negative_zero_and_overflow() {
    assert!(parse_count("-1").unwrap_err().contains("negative"));
    assert!(parse_count("0").is_err());
    assert!(
        parse_count("99999999999999999999999")
            .unwrap_err()
            .contains("64 bits")
    );
    assert_eq!(parse_count("12").unwrap(), 12);
}

#[test]
fn ids_exclude_the_sentinel() {
    assert!(parse_id("4294967295").is_err());
    assert_eq!(parse_id("65534").unwrap(), 65534);
}

#[test]
fn uid_ranges_are_validated() {
    assert_eq!(
        parse_uid_range("2000-2001").unwrap(),
        UidRange {
            start: 2000,
            end: 2001
        }
    );
    assert!(parse_uid_range("5000-3000").is_err());
    assert!(parse_uid_range("0-5000").is_err());
    assert!(parse_uid_range("5000").is_err());
    assert!(parse_uid_range("5000-4294967295").is_err());
}

#[test]
fn typos_suggest_the_nearest_subcommand() {
    assert_eq!(nearest_subcommand("rnu"), Some("run"));
    assert_eq!(nearest_subcommand("chekc"), Some("check"));
    assert_eq!(nearest_subcommand("cert"), Some("certs"));
    assert_eq!(nearest_subcommand("copyself"), Some("copy-self"));
    assert_eq!(nearest_subcommand("python3"), None);
}

#[test]
fn log_levels_are_validated() {
    assert!(parse_log_level("bogus").is_err());
    assert!(parse_log_level("info").is_ok());
    assert!(parse_log_level("warn,openshell_sandbox=debug").is_ok());
    assert!(parse_log_level("x=loud").is_err());
}

#[test]
fn defaults_are_not_explicit_flags() {
    let v = |a: &[&str]| {
        a.iter()
            .map(|s| OsString::from(*s))
            .collect::<Vec<OsString>>()
    };
    let a = RunArgs::parse_argv(&v(&["run", "--", "true"])).unwrap();
    assert_eq!(a.flags.network, None);
    assert_eq!(a.flags.pids, None);
    assert_eq!(a.flags.open_files, None);
    let a = RunArgs::parse_argv(&v(&[
        "run",
        "--network",
        "none",
        "--pids",
        "512",
        "--",
        "true",
    ]))
    .unwrap();
    assert_eq!(a.flags.network, Some(NetworkMode::None));
    assert_eq!(a.flags.pids, Some(512));
}

#[test]
fn run_takes_the_command_with_or_without_double_dash() {
    assert!(RunArgs::try_parse_from(["run"]).is_err());
    assert!(RunArgs::try_parse_from(["run", "--timeout", "2"]).is_err());
    let a = RunArgs::try_parse_from(["run", "--timeout", "2", "--", "sh", "-c", "x"]).unwrap();
    assert_eq!(a.command, ["sh", "-c", "x"]);
    assert_eq!(a.timeout, Some(2.0));
    // Without `--`, the first word that is no flag of ours starts the command; flags after
    // it are the command's, even ours.
    let a = RunArgs::try_parse_from(["run", "-q", "sh", "-c", "x", "--timeout", "3"]).unwrap();
    assert_eq!(a.command, ["sh", "-c", "x", "--timeout", "3"]);
    assert!(a.quiet);
    assert_eq!(a.timeout, None);
    let a = RunArgs::try_parse_from(["run", "true"]).unwrap();
    assert_eq!(a.command, ["true"]);
    // A flag of ours that is misspelt is an error, never the command.
    assert!(RunArgs::try_parse_from(["run", "--timeuot", "2", "true"]).is_err());
    // After `--`, a word that looks like a flag is the command.
    let a = RunArgs::try_parse_from(["run", "--", "-x"]).unwrap();
    assert_eq!(a.command, ["-x"]);
}

#[test]
fn every_command_definition_is_consistent() {
    RunArgs::command().debug_assert();
    CheckArgs::command().debug_assert();
    TopArgs::command().debug_assert();
    CompletionsArgs::command().debug_assert();
    ManArgs::command().debug_assert();
}

#[test]
fn run_help_groups_the_flags_under_headings() {
    let help = RunArgs::command().render_long_help().to_string();
    for h in [ISOLATION, LIMITS, OUTPUT, IDENTITY, REPORTING] {
        assert!(help.contains(&format!("{h}:")), "no {h} heading:\n{help}");
    }
    let check = CheckArgs::command().render_long_help().to_string();
    let tmp = std::env::temp_dir();
    assert!(
        check.contains(&format!("Default: the temp directory ({})", tmp.display())),
        "{check}"
    );
}
