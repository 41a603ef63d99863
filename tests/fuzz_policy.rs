//! Fuzzing the policy inputs: `policy::parse_size` against an independent reference, and the
//! `run` command line (`cli::RunArgs::try_parse_from`, then `Policy::from_args`) on argv made
//! of real flags and hostile values. No input may panic; whatever is accepted must be within
//! the bounds the sandbox relies on. Seeds: fuzz/corpus/parse_size, fuzz/corpus/run_cli.

mod support;

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use openshell_sandbox::cli::RunArgs;
use openshell_sandbox::policy::{MIN_MEMORY, ParseSizeError, Policy, parse_memory, parse_size};
use proptest::prelude::*;

/// What parse_size must answer, written from its contract rather than its code: optional
/// whitespace, ASCII digits, an optional unit from the table (binary K/Ki/KiB ... powers of
/// 1024, KB/MB ... powers of 1000), optional whitespace; negative, malformed, unknown unit,
/// overflow and zero are errors. A number too long for 64 bits is an overflow before its unit
/// is looked at.
#[derive(Debug, PartialEq, Eq)]
enum Want {
    Bytes(u64),
    Negative,
    Malformed,
    Unit,
    Overflow,
    Zero,
}

fn reference(input: &str) -> Want {
    let s = input.trim();
    if s.starts_with('-') {
        return Want::Negative;
    }
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return Want::Malformed;
    }
    let Ok(n) = digits.parse::<u64>() else {
        return Want::Overflow;
    };
    let mult: u128 = match s[digits.len()..].trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "Ki" => 1 << 10,
        "M" | "m" | "MiB" | "Mi" => 1 << 20,
        "G" | "g" | "GiB" | "Gi" => 1 << 30,
        "T" | "t" | "TiB" | "Ti" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Want::Unit,
    };
    let v = u128::from(n) * mult;
    if v > u128::from(u64::MAX) {
        Want::Overflow
    } else if v == 0 {
        Want::Zero
    } else {
        Want::Bytes(v as u64)
    }
}

fn actual(input: &str) -> Want {
    match parse_size(input) {
        Ok(v) => Want::Bytes(v),
        Err(ParseSizeError::Negative(_)) => Want::Negative,
        Err(ParseSizeError::Malformed(_)) => Want::Malformed,
        Err(ParseSizeError::Unit(..)) => Want::Unit,
        Err(ParseSizeError::Overflow(_)) => Want::Overflow,
        Err(ParseSizeError::Zero) => Want::Zero,
        Err(e @ ParseSizeError::TooLittleMemory(..)) => {
            panic!("parse_size judged a size as memory: {e}")
        }
    }
}

fn check_size(input: &str) -> Result<(), TestCaseError> {
    let got = actual(input);
    prop_assert_eq!(&got, &reference(input), "parse_size({:?})", input);
    if let Err(e) = parse_size(input) {
        prop_assert!(!e.to_string().is_empty());
    }
    // A memory limit is a size of at least MIN_MEMORY; anything else is parse_size's answer.
    match (parse_memory(input), parse_size(input)) {
        (Ok(m), Ok(s)) => prop_assert!(m == s && m >= MIN_MEMORY, "{input:?}"),
        (Err(ParseSizeError::TooLittleMemory(_, v)), Ok(s)) => {
            prop_assert!(v == s && s < MIN_MEMORY, "{input:?}")
        }
        (Err(m), Err(s)) => prop_assert_eq!(m, s),
        (m, s) => prop_assert!(false, "{input:?}: memory {m:?}, size {s:?}"),
    }
    Ok(())
}

const UNITS: &[&str] = &[
    "", "B", "b", "K", "k", "Ki", "KiB", "KB", "kB", "M", "m", "Mi", "MiB", "MB", "G", "g", "Gi",
    "GiB", "GB", "T", "t", "Ti", "TiB", "TB", "P", "PiB", "kb", "mb", "iB", "KiBB", " K", "K ",
];

/// Inputs shaped like sizes, with the edges that matter: zero, the 64-bit boundary, signs,
/// whitespace (including non-ASCII), and units near the real ones.
fn size_like() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..4096).prop_map(|n| n.to_string()),
        "[0-9]{15,25}",
        Just("18446744073709551615".to_string()),
        Just("18446744073709551616".to_string()),
        Just("0".to_string()),
        Just("00000".to_string()),
    ];
    let space = prop_oneof![
        Just(""),
        Just(" "),
        Just("\t"),
        Just("\u{a0}"),
        Just("\u{2003}")
    ];
    let sign = prop_oneof![Just(""), Just("-"), Just("+"), Just("--")];
    (
        space.clone(),
        sign,
        number,
        space.clone(),
        proptest::sample::select(UNITS),
        space,
    )
        .prop_map(|(a, s, n, b, u, c)| format!("{a}{s}{n}{b}{u}{c}"))
}

#[test]
fn parse_size_seeds() {
    for (name, bytes) in support::fuzz::corpus("parse_size") {
        let text = String::from_utf8_lossy(&bytes);
        for line in text.lines() {
            check_size(line).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        }
    }
}

#[test]
fn parse_size_matches_the_reference() {
    let strategy = prop_oneof![size_like(), any::<String>()];
    support::fuzz::run(
        "parse_size_matches_the_reference",
        support::fuzz::config(20_000),
        &strategy,
        |input| check_size(&input),
    );
}

#[test]
fn parse_size_round_trips() {
    let strategy = (1u64.., proptest::sample::select(UNITS));
    support::fuzz::run(
        "parse_size_round_trips",
        support::fuzz::config(20_000),
        &strategy,
        |(n, unit)| {
            let input = format!("{n}{unit}");
            check_size(&input)?;
            if unit.is_empty() {
                prop_assert_eq!(parse_size(&input), Ok(n));
            }
            Ok(())
        },
    );
}

// ---- the run command line -------------------------------------------------------------

const FLAGS: &[&str] = &[
    "--workdir",
    "--ro",
    "--rw",
    "--deny",
    "--network",
    "--cpu",
    "--memory",
    "--pids",
    "--file-size",
    "--open-files",
    "--uid",
    "--gid",
    "--allow-degraded",
    "--log-level",
    "--log-format",
    "--scratch",
    "--env",
    "--inherit-env",
    "--timeout",
    "--kill-grace",
    "--max-output",
    "--report-json",
    "-q",
    "--quiet",
    "--",
    "--help",
    "-V",
    "--bogus",
    "-",
];

/// Values that have broken parsers before: numbers at and past every boundary, floats that are
/// not numbers, sizes, paths, K=V pairs with odd keys, NUL bytes.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        size_like(),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        proptest::sample::select(vec![
            "NaN",
            "inf",
            "-inf",
            "1e309",
            "-0",
            "0",
            "0.0",
            "1e-320",
            "31536000",
            "31536001",
            "4294967294",
            "4294967295",
            "4294967296",
            "9223372036854775807",
            "9223372036854775808",
            "1048576",
            "1048577",
            "none",
            "all",
            "json",
            "human",
            "/",
            "/tmp",
            ".",
            "..",
            "",
            "=",
            "A=",
            "=B",
            "1A=x",
            "A=b=c",
            "OPENSHELL_X=1",
            "PATH=/x",
            "A=\u{0}",
            "\u{0}",
            "/nonexistent/dir",
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,12}",
    ]
}

/// A plausible value for a flag that takes one, so that many argv get past clap.
fn plausible(flag: &'static str) -> BoxedStrategy<String> {
    match flag {
        "--memory" | "--file-size" | "--max-output" => size_like().boxed(),
        "--cpu" | "--pids" | "--open-files" | "--uid" | "--gid" => prop_oneof![
            any::<u32>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            (0u64..70000).prop_map(|n| n.to_string()),
        ]
        .boxed(),
        "--timeout" | "--kill-grace" => prop_oneof![
            (0.0f64..4e7).prop_map(|f| f.to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
        ]
        .boxed(),
        "--network" => proptest::sample::select(vec!["none", "all"])
            .prop_map(str::to_owned)
            .boxed(),
        "--log-format" => proptest::sample::select(vec!["human", "json"])
            .prop_map(str::to_owned)
            .boxed(),
        "--env" => ("[A-Za-z_][A-Za-z0-9_]{0,6}", "[ -~]{0,8}")
            .prop_map(|(k, v)| format!("{k}={v}"))
            .boxed(),
        _ => prop_oneof![
            Just("/tmp".to_string()),
            Just(".".to_string()),
            "[a-z/]{1,10}"
        ]
        .boxed(),
    }
}

const VALUE_FLAGS: &[&str] = &[
    "--workdir",
    "--ro",
    "--rw",
    "--deny",
    "--network",
    "--cpu",
    "--memory",
    "--pids",
    "--file-size",
    "--open-files",
    "--uid",
    "--gid",
    "--log-level",
    "--log-format",
    "--env",
    "--inherit-env",
    "--timeout",
    "--kill-grace",
    "--max-output",
    "--report-json",
];

/// One item of an argv: mostly a flag with a plausible value (in either form), sometimes a
/// hostile value, a switch or a stray token.
fn item() -> impl Strategy<Value = Vec<String>> {
    let with_value = proptest::sample::select(VALUE_FLAGS).prop_flat_map(|f| {
        (
            prop_oneof![4 => plausible(f), 1 => value().boxed()],
            any::<bool>(),
        )
            .prop_map(move |(v, joined)| {
                if joined {
                    vec![format!("{f}={v}")]
                } else {
                    vec![f.to_string(), v]
                }
            })
    });
    prop_oneof![
        6 => with_value,
        1 => proptest::sample::select(FLAGS).prop_map(|f| vec![f.to_string()]),
        1 => value().prop_map(|v| vec![v]),
    ]
}

fn argv() -> impl Strategy<Value = Vec<String>> {
    (
        proptest::collection::vec(item(), 0..8),
        proptest::bool::weighted(0.9),
    )
        .prop_map(|(items, cmd)| {
            let mut v: Vec<String> = items.into_iter().flatten().collect();
            if cmd {
                v.extend(["--".into(), "sh".into(), "-c".into(), "true".into()]);
            }
            v
        })
}

/// The last value given for `flag`, in either `--flag V` or `--flag=V` form, among run's own
/// words: before `--`, and before the command (which starts at the first word that is no flag
/// of run's, `--` or not: `command_len` is how many words it took).
fn last_value<'a>(argv: &'a [String], command_len: usize, flag: &str) -> Option<&'a str> {
    let end = argv
        .iter()
        .position(|a| a == "--")
        .unwrap_or(argv.len())
        .min(argv.len() - command_len);
    let mut found = None;
    let mut i = 0;
    while i < end {
        let a = &argv[i];
        if a == flag && i + 1 < argv.len() {
            found = Some(argv[i + 1].as_str());
            i += 1;
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v);
        }
        i += 1;
    }
    found
}

fn check_cli(argv: &[String]) -> Result<(), TestCaseError> {
    let full: Vec<&str> = std::iter::once("run")
        .chain(argv.iter().map(String::as_str))
        .collect();
    let Ok(args) = RunArgs::try_parse_from(&full) else {
        return Ok(());
    };
    prop_assert!(
        !args.command.is_empty(),
        "accepted without a command: {:?}",
        argv
    );
    // What run.rs does with the times must not panic.
    if let Some(t) = args.timeout {
        prop_assert!(
            t.is_finite() && t > 0.0 && t <= 365.0 * 86400.0,
            "timeout {}",
            t
        );
        let _ = Duration::from_secs_f64(t);
    }
    prop_assert!(args.kill_grace.is_finite() && args.kill_grace >= 0.0);
    let _ = Duration::from_secs_f64(args.kill_grace);
    for (k, v) in &args.env {
        prop_assert!(
            !k.is_empty() && !k.as_bytes()[0].is_ascii_digit(),
            "env key {:?}",
            k
        );
        prop_assert!(k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        prop_assert!(!v.contains('\0'));
    }
    for id in [args.policy.uid, args.policy.gid].into_iter().flatten() {
        prop_assert!(
            id != u32::MAX,
            "the setresuid 'no change' sentinel was accepted"
        );
    }
    prop_assert!(args.policy.pids.is_none_or(|p| p >= 1) && args.policy.open_files >= 1);
    prop_assert!(args.policy.memory.is_none_or(|m| m >= MIN_MEMORY));
    // An accepted size is exactly what parse_size says about the last value given.
    for (flag, got) in [
        ("--memory", args.policy.memory),
        ("--file-size", args.policy.file_size),
        ("--max-output", args.max_output),
    ] {
        if let (Some(v), Some(got)) = (last_value(argv, args.command.len(), flag), got) {
            prop_assert_eq!(parse_size(v).ok(), Some(got), "{} {:?}", flag, v);
        }
    }
    // The policy: errors are fine, panics are not, and what validates is within the kernel's
    // bounds (RLIM_INFINITY would silently mean "no limit").
    if let Ok(policy) = Policy::from_args(&args.policy, Path::new("/tmp"), Vec::new()) {
        let l = &policy.limits;
        for v in [l.cpu_secs, l.memory_bytes, l.file_size_bytes]
            .into_iter()
            .flatten()
        {
            prop_assert!(v <= u64::MAX / 2);
        }
        prop_assert!(l.pids <= u64::MAX / 2 && l.open_files <= 1 << 20);
        prop_assert!(policy.fs.workdir.is_absolute());
    }
    Ok(())
}

#[test]
fn run_cli_seeds() {
    for (name, bytes) in support::fuzz::corpus("run_cli") {
        let argv: Vec<String> = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("seed {name} is not a JSON array of strings: {e}"));
        check_cli(&argv).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
}

/// Generated argv. The counts make sure the harness is not vacuous: a good share of the cases
/// must get past clap and past the policy, or the checks above would rarely run.
#[test]
fn run_cli_never_panics_and_accepts_only_sane_limits() {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    let (parsed, total) = (AtomicU32::new(0), AtomicU32::new(0));
    support::fuzz::run("run_cli", support::fuzz::config(3_000), &argv(), |argv| {
        total.fetch_add(1, Relaxed);
        let full = std::iter::once("run").chain(argv.iter().map(String::as_str));
        if RunArgs::try_parse_from(full).is_ok() {
            parsed.fetch_add(1, Relaxed);
        }
        check_cli(&argv)
    });
    let (parsed, total) = (parsed.into_inner(), total.into_inner());
    eprintln!("run_cli: {parsed} of {total} generated argv parsed");
    assert!(
        parsed * 10 >= total,
        "only {parsed} of {total} argv parsed: the generator misses"
    );
}
