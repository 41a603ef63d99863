//! Fuzzing what the gateway side can send (SECURITY.md "Gateway-side targets"):
//! - `OPENSHELL_MAIN_PROCESS_SPEC` (JSON and `base64url:`), through `main_spec::parse_spec`
//!   and `MainProcess::from_sources`, and a few rejected specs through the real binary;
//! - exec command strings, through `gateway::exec_service::parse_command`, around the 256 KiB limit;
//! - the SSH server fed arbitrary bytes over relays to one running supervisor;
//! - sequences of `RelayOpen` with hostile ids and targets, to one running supervisor.
//!
//! The end-to-end targets assert liveness afterwards: the supervisor is alive, its RSS is
//! bounded, no relay slot leaked, and a normal exec still prints `hello`.
//! Seeds: fuzz/corpus/{main_process_spec,exec_command,ssh_relay}. `OSB_FUZZ_CASES=N` scales
//! every target; `OSB_FUZZ_SECONDS=N` runs each for N seconds instead (tests/fuzz_support).

mod support;
use support::fuzz::runtime;

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use openshell_sandbox::gateway::exec_service::{CommandError, MAX_COMMAND, parse_command};
use openshell_sandbox::gateway::main_spec::{MainProcess, SpecError, parse_spec};
use openshell_sandbox::proto::v1::*;
use proptest::prelude::*;
use support::gateway::bridge;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LONG: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// OPENSHELL_MAIN_PROCESS_SPEC

/// What an accepted spec must look like, whatever the input was.
fn check_accepted(input: &str, mp: &MainProcess) -> Result<(), TestCaseError> {
    prop_assert!(!mp.argv.is_empty(), "{input:?} accepted with no argv");
    prop_assert!(
        !mp.argv[0].is_empty(),
        "{input:?} accepted with an empty argv[0]"
    );
    for w in &mp.argv {
        prop_assert!(!w.as_encoded_bytes().contains(&0), "{input:?}: NUL in argv");
    }
    // Serialise and parse again, in both forms: the same spec.
    let words: Vec<&str> = mp.argv.iter().map(|w| w.to_str().unwrap()).collect();
    let json = serde_json::json!({"version": 1, "command": words, "tty": mp.tty}).to_string();
    prop_assert_eq!(parse_spec(&json), Ok(mp.clone()));
    let b64 = format!("base64url:{}", URL_SAFE_NO_PAD.encode(&json));
    prop_assert_eq!(parse_spec(&b64), Ok(mp.clone()));
    Ok(())
}

fn check_spec(input: &str) -> Result<(), TestCaseError> {
    match parse_spec(input) {
        Ok(mp) => check_accepted(input, &mp)?,
        Err(SpecError::Spec(m)) => prop_assert!(!m.is_empty()),
        Err(e @ SpecError::Nul(_)) => {
            prop_assert!(e.to_string().starts_with("OPENSHELL_MAIN_PROCESS_SPEC"))
        }
        Err(e) => prop_assert!(false, "{input:?}: unexpected error kind {e:?}"),
    }
    if let Err(e) = parse_spec(input) {
        prop_assert!(
            e.to_string().contains("OPENSHELL_MAIN_PROCESS_SPEC"),
            "error does not name the variable: {e}"
        );
    }
    // from_sources trims, and an all-blank spec means "no spec".
    let via_sources = MainProcess::from_sources(&[], Some(input), None);
    if input.trim().is_empty() {
        prop_assert_eq!(via_sources, Ok(None));
    } else {
        prop_assert_eq!(via_sources, parse_spec(input.trim()).map(Some));
    }
    Ok(())
}

/// A well-formed spec's fields, and what parse_spec must make of them.
fn spec_strategy() -> impl Strategy<Value = (u32, Vec<String>, Option<bool>, u8)> {
    let word = prop_oneof![
        4 => "[a-z/._-]{1,12}",
        1 => Just(String::new()),
        1 => ".{0,8}",
        1 => "[a-z]{0,3}\u{0}[a-z]{0,3}",
    ];
    (
        prop_oneof![8 => Just(1u32), 1 => any::<u32>()],
        prop::collection::vec(word, 0..6),
        prop::option::of(any::<bool>()),
        0u8..4,
    )
}

fn render(version: u32, argv: &[String], tty: Option<bool>, form: u8) -> String {
    let mut obj = serde_json::json!({"version": version, "command": argv});
    if let Some(t) = tty {
        obj["tty"] = t.into();
    }
    let json = obj.to_string();
    match form {
        0 => json,
        1 => format!("  {json}\n"),
        2 => format!("base64url:{}", URL_SAFE_NO_PAD.encode(&json)),
        // Padded, with blanks around the payload: both are tolerated.
        _ => format!(
            "base64url: {} ",
            base64::engine::general_purpose::URL_SAFE.encode(&json)
        ),
    }
}

/// Random edits of a valid spec: the near misses a real bug would produce.
fn mutate(s: &str, edits: &[(usize, u8, char)]) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    for &(at, op, c) in edits {
        let at = if chars.is_empty() {
            0
        } else {
            at % (chars.len() + 1)
        };
        match op % 3 {
            0 => chars.insert(at, c),
            1 if at < chars.len() => {
                chars.remove(at);
            }
            _ if at < chars.len() => chars[at] = c,
            _ => {}
        }
    }
    chars.into_iter().collect()
}

#[test]
fn main_process_spec_seeds() {
    for (name, bytes) in support::fuzz::corpus("main_process_spec") {
        let s = String::from_utf8_lossy(&bytes);
        let s = s.trim_end_matches('\n');
        if let Err(e) = check_spec(s) {
            panic!("seed {name}: {e}");
        }
    }
    // Over the 1 MiB limit: refused before any parsing, whatever it holds.
    let huge = format!(
        "{{\"version\":1,\"command\":[\"{}\"]}}",
        "x".repeat(1 << 20)
    );
    assert!(matches!(parse_spec(&huge), Err(SpecError::Spec(m)) if m.contains("limit")));
}

#[test]
fn main_process_spec_arbitrary() {
    support::fuzz::run(
        "main_process_spec_arbitrary",
        support::fuzz::config(2000),
        &".{0,200}",
        |s| {
            check_spec(&s)?;
            check_spec(&format!("base64url:{}", URL_SAFE_NO_PAD.encode(&s)))
        },
    );
}

#[test]
fn main_process_spec_well_formed() {
    support::fuzz::run(
        "main_process_spec_well_formed",
        support::fuzz::config(2000),
        &spec_strategy(),
        |(version, argv, tty, form)| {
            let input = render(version, &argv, tty, form);
            let got = parse_spec(input.trim());
            let valid = version == 1
                && argv.first().is_some_and(|w| !w.is_empty())
                && argv.iter().all(|w| !w.contains('\0'));
            if valid {
                let want = MainProcess {
                    argv: argv.iter().map(OsString::from).collect(),
                    tty: tty.unwrap_or(false),
                };
                prop_assert_eq!(got, Ok(want), "{}", input);
            } else {
                prop_assert!(got.is_err(), "{input:?} accepted: {got:?}");
            }
            check_spec(&input)
        },
    );
}

#[test]
fn main_process_spec_mutated() {
    let edits = prop::collection::vec((any::<usize>(), any::<u8>(), any::<char>()), 1..6);
    support::fuzz::run(
        "main_process_spec_mutated",
        support::fuzz::config(2000),
        &(spec_strategy(), edits),
        |((version, argv, tty, form), edits)| {
            check_spec(&mutate(&render(version, &argv, tty, form), &edits))
        },
    );
}

/// Rejected specs through the real binary.
#[test]
fn main_process_spec_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<String> = vec![
        "{".into(),
        "base64url:!!!".into(),
        r#"{"version":2,"command":["true"]}"#.into(),
        r#"{"version":1,"command":[]}"#.into(),
        r#"{"version":1,"command":["a\u0000b"]}"#.into(),
        format!(
            "{{\"version\":1,\"command\":[\"{}\"]",
            "x".repeat(100 << 10)
        ),
    ];
    for input in &inputs {
        spec_through_the_binary(dir.path(), input);
    }
    let generated = std::sync::atomic::AtomicUsize::new(0);
    support::fuzz::run(
        "main_process_spec_through_the_binary",
        support::fuzz::config(12),
        &".{1,64}",
        |s| {
            // Only rejected specs: an accepted one would start a main process.
            if !s.contains('\0') && parse_spec(s.trim()).is_err() && !s.trim().is_empty() {
                spec_through_the_binary(dir.path(), &s);
                generated.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        },
    );
    eprintln!(
        "{} rejected specs through the binary",
        inputs.len() + generated.into_inner()
    );
}

/// One rejected spec through the binary: a clean error naming the variable, never a panic
/// (101) or an abort (134, or death by signal).
fn spec_through_the_binary(dir: &std::path::Path, input: &str) {
    let mut child = Command::new(BIN)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("OPENSHELL_MAIN_PROCESS_SPEC", input)
        .arg("--workdir")
        .arg(dir)
        .arg("--allow-degraded")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LONG;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("supervisor still running 60 s after a bad spec {input:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let shown: String = input.chars().take(80).collect();
    assert!(
        status
            .code()
            .is_some_and(|c| c != 0 && c != 101 && c != 134),
        "spec {shown:?}: {status:?}\n{err}"
    );
    assert!(
        err.contains("OPENSHELL_MAIN_PROCESS_SPEC"),
        "spec {shown:?}: the error does not name the variable:\n{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Exec command strings

/// The documented contract (docs/gateway.md): over 256 KiB or with a NUL refused, the rest
/// decoded as lossy UTF-8 and trimmed, and an empty result refused.
fn check_command(raw: &[u8]) -> Result<(), TestCaseError> {
    let got = parse_command(raw);
    if raw.len() > MAX_COMMAND {
        prop_assert_eq!(got, Err(CommandError::TooLong(raw.len())));
    } else if let Some(at) = raw.iter().position(|b| *b == 0) {
        prop_assert_eq!(got, Err(CommandError::Nul(at)));
    } else {
        let s = String::from_utf8_lossy(raw);
        let s = s.trim();
        if s.is_empty() {
            prop_assert_eq!(got, Err(CommandError::Empty));
        } else {
            let got = got.map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(got.as_str(), s);
            prop_assert!(!got.contains('\0'));
        }
    }
    if let Err(e) = parse_command(raw) {
        prop_assert!(!e.to_string().is_empty());
    }
    Ok(())
}

/// Commands within a few bytes of the limit, with NULs, invalid UTF-8 and blanks placed.
fn near_limit() -> impl Strategy<Value = Vec<u8>> {
    (
        (MAX_COMMAND - 3)..=(MAX_COMMAND + 3),
        prop::sample::select(vec![b'a', b' ', 0xff, b'\n']),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    )
        .prop_map(|(len, fill, edits)| {
            let mut v = vec![fill; len];
            for (i, b) in edits {
                v[i.index(len)] = b;
            }
            v
        })
}

#[test]
fn exec_command_seeds() {
    for (name, bytes) in support::fuzz::corpus("exec_command") {
        if let Err(e) = check_command(&bytes) {
            panic!("seed {name}: {e}");
        }
    }
}

#[test]
fn exec_command_arbitrary() {
    support::fuzz::run(
        "exec_command_arbitrary",
        support::fuzz::config(2000),
        &prop::collection::vec(any::<u8>(), 0..512),
        |raw| check_command(&raw),
    );
}

#[test]
fn exec_command_text() {
    support::fuzz::run(
        "exec_command_text",
        support::fuzz::config(2000),
        &"[ \t\r\n]{0,3}.{0,64}[ \t\r\n]{0,3}",
        |s| check_command(s.as_bytes()),
    );
}

#[test]
fn exec_command_near_the_limit() {
    support::fuzz::run(
        "exec_command_near_the_limit",
        support::fuzz::config(64),
        &near_limit(),
        |raw| check_command(&raw),
    );
}

// ---------------------------------------------------------------------------------------------
// End to end: one supervisor, many hostile inputs

fn ssh_target() -> Option<relay_open::Target> {
    Some(relay_open::Target::Ssh(SshRelayTarget {}))
}

/// The liveness every end-to-end target ends with.
async fn assert_serving(gw: &TestGateway, sup: &Mutex<Supervisor>, baseline: u64) -> u64 {
    let rss = {
        let mut s = sup.lock().unwrap();
        assert!(s.try_status().is_none(), "supervisor died:\n{}", s.log());
        s.rss_kib()
    };
    let r = gw.sh("echo hello").await;
    assert_eq!(
        (r.out(), r.exit),
        ("hello\n".to_string(), Some(0)),
        "{r:?}\n{}",
        sup.lock().unwrap().log()
    );
    let growth = rss.saturating_sub(baseline);
    assert!(
        growth < 32 * 1024,
        "supervisor RSS grew by {growth} KiB (baseline {baseline} KiB)"
    );
    rss
}

/// What a real client sends: a russh client's bytes toward the server, recorded through a tee
/// while it authenticates and runs `echo hello`. Only the banner and KEXINIT are plaintext;
/// the rest is ciphertext under keys no replay will have, which is itself good garbage.
async fn record_client_transcript(gw: &TestGateway) -> Vec<u8> {
    let relay = gw.state.open_relay(ssh_target()).await.unwrap();
    let server = bridge(relay);
    let (client, tee) = tokio::io::duplex(64 * 1024);
    let (mut srv_rd, mut srv_wr) = tokio::io::split(server);
    let (mut tee_rd, mut tee_wr) = tokio::io::split(tee);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rec = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = tee_rd.read(&mut buf).await {
            if n == 0 || srv_wr.write_all(&buf[..n]).await.is_err() {
                break;
            }
            rec.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        let _ = srv_wr.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut srv_rd, &mut tee_wr).await;
        let _ = tee_wr.shutdown().await;
    });
    let h = exec::ssh_connect(client).await.unwrap();
    let mut ch = h.channel_open_session().await.unwrap();
    ch.exec(true, b"echo hello".to_vec()).await.unwrap();
    ch.eof().await.unwrap();
    while let Some(m) = ch.wait().await {
        if matches!(m, russh::ChannelMsg::Close) {
            break;
        }
    }
    let _ = h
        .disconnect(russh::Disconnect::ByApplication, "", "en")
        .await;
    let t = seen.lock().unwrap().clone();
    assert!(t.starts_with(b"SSH-2.0-"), "{:?}", &t[..t.len().min(32)]);
    t
}

/// Send `input` over a fresh relay, end our side, and read until the supervisor ends its side.
/// Returns how many bytes the server sent back; a relay that never ends is a hang.
async fn feed(gw: &TestGateway, input: &[u8]) -> Result<usize, String> {
    let relay = gw
        .state
        .open_relay(ssh_target())
        .await
        .map_err(|e| format!("relay open: {e:?}"))?;
    // Write and read at once: the server may answer (or give up) before reading everything.
    let (mut rd_half, mut wr_half) = tokio::io::split(bridge(relay));
    let write = async {
        let _ = wr_half.write_all(input).await;
        let _ = wr_half.shutdown().await;
    };
    let read = async {
        let mut back = Vec::new();
        let _ = rd_half.read_to_end(&mut back).await;
        back.len()
    };
    let ((), n) = tokio::time::timeout(LONG, async { tokio::join!(write, read) })
        .await
        .map_err(|_| format!("relay still open 60 s after {} bytes and EOF", input.len()))?;
    Ok(n)
}

fn ssh_inputs(transcript: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let t1 = transcript.clone();
    let t2 = transcript.clone();
    let banner_end = transcript
        .windows(2)
        .position(|w| w == b"\r\n")
        .map_or(0, |p| p + 2);
    let banner = transcript[..banner_end].to_vec();
    let b1 = banner.clone();
    let b2 = banner;
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..4096),
        // A real banner, then noise.
        prop::collection::vec(any::<u8>(), 0..4096).prop_map(move |v| [b1.clone(), v].concat()),
        // A real client's stream cut anywhere.
        (0..=t1.len()).prop_map(move |n| t1[..n].to_vec()),
        // A real client's stream with a few bytes changed, then cut.
        (
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            any::<prop::sample::Index>(),
        )
            .prop_map(move |(edits, cut)| {
                let mut v = t2.clone();
                for (i, b) in edits {
                    let at = i.index(v.len());
                    v[at] = b;
                }
                v.truncate(cut.index(v.len() + 1));
                v
            }),
        // A banner, then a packet header announcing any length, then a few bytes.
        (any::<u32>(), prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(move |(len, v)| { [b2.clone(), len.to_be_bytes().to_vec(), v].concat() }),
    ]
}

#[test]
fn ssh_server_fed_arbitrary_bytes_over_relays() {
    let rt = runtime();
    let (gw, sup) = rt.block_on(up(AuthMode::Jwt, SupOpts::default()));
    let sup = Mutex::new(sup);
    let baseline = rt.block_on(async {
        assert_eq!(gw.sh("echo warm").await.exit, Some(0));
        sup.lock().unwrap().rss_kib()
    });
    let transcript = rt.block_on(record_client_transcript(&gw));

    let mut fed = 0u32;
    let mut most_back = 0usize;
    for (name, bytes) in support::fuzz::corpus("ssh_relay") {
        let n = rt
            .block_on(feed(&gw, &bytes))
            .unwrap_or_else(|e| panic!("seed {name}: {e}"));
        most_back = most_back.max(n);
        fed += 1;
    }
    let counts = Mutex::new((fed, most_back));
    let strategy = ssh_inputs(transcript);
    support::fuzz::try_run("ssh_relay", support::fuzz::config(48), &strategy, |input| {
        let n = rt
            .block_on(feed(&gw, &input))
            .map_err(TestCaseError::fail)?;
        // Garbage is answered with at most the banner, KEXINIT and a little more.
        prop_assert!(n < 64 * 1024, "{n} bytes back for {} bytes in", input.len());
        let mut c = counts.lock().unwrap();
        c.0 += 1;
        c.1 = c.1.max(n);
        let mut s = sup.lock().unwrap();
        prop_assert!(s.try_status().is_none(), "supervisor died:\n{}", s.log());
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sup.lock().unwrap().log()));
    let rss = rt.block_on(assert_serving(&gw, &sup, baseline));
    let (fed, most_back) = *counts.lock().unwrap();
    eprintln!(
        "{fed} hostile SSH streams through relays; at most {most_back} bytes back; RSS {baseline} -> {rss} KiB; exec still prints hello"
    );
}

/// One step of a hostile gateway: a RelayOpen the test gateway may not even have registered.
#[derive(Debug, Clone)]
enum Open {
    /// Sent but not registered, so the supervisor's claim is refused with NOT_FOUND.
    Unregistered(String, Option<relay_open::Target>),
    /// Registered: the supervisor either claims it or answers RelayOpenResult{success=false}.
    Registered(String, Option<relay_open::Target>),
}

fn target_strategy(closed_port: u16) -> impl Strategy<Value = Option<relay_open::Target>> {
    let tcp =
        |host: String, port: u32| Some(relay_open::Target::Tcp(TcpRelayTarget { host, port }));
    prop_oneof![
        Just(None),
        Just(ssh_target()),
        // Loopback: only at a port nothing listens on, or an invalid one.
        (
            prop::sample::select(vec![
                "127.0.0.1",
                "localhost",
                "::1",
                "LOCALHOST",
                " 127.0.0.1"
            ]),
            prop::sample::select(vec![u32::from(closed_port), 0, 65536, u32::MAX]),
        )
            .prop_map(move |(h, p)| tcp(h.to_string(), p)),
        // Anything else is refused before any connection is made.
        (
            prop_oneof![
                Just("10.0.0.1".to_string()),
                Just("169.254.169.254".to_string()),
                Just("127.0.0.1.nip.io".to_string()),
                Just(String::new()),
                ".{0,40}",
            ],
            any::<u32>(),
        )
            .prop_map(move |(h, p)| tcp(h, p)),
    ]
}

fn open_strategy(closed_port: u16, held: String) -> impl Strategy<Value = Vec<Open>> {
    let id = prop_oneof![
        Just(String::new()),
        Just(held),
        Just("dup".to_string()),
        "[a-z0-9-]{1,36}",
        ".{0,64}",
        "x{200,300}",
    ];
    let open = (any::<bool>(), id, target_strategy(closed_port)).prop_map(|(reg, id, t)| {
        if reg {
            Open::Registered(id, t)
        } else {
            Open::Unregistered(id, t)
        }
    });
    prop::collection::vec(open, 1..8)
}

#[test]
fn relay_open_sequences_from_a_hostile_gateway() {
    const MAX_EXECS: usize = 4;
    let rt = runtime();
    let (gw, sup) = rt.block_on(up(
        AuthMode::Jwt,
        SupOpts {
            args: vec!["--max-execs".into(), MAX_EXECS.to_string()],
            ..Default::default()
        },
    ));
    let sup = Mutex::new(sup);
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // One relay held open for the whole run, so duplicates of its id are exercised.
    let (held_id, _held, baseline) = rt.block_on(async {
        assert_eq!(gw.sh("echo warm").await.exit, Some(0));
        let id = "held-relay".to_string();
        let r = gw
            .state
            .open_relay_with_id(id.clone(), ssh_target(), true)
            .await
            .unwrap();
        (id, bridge(r), sup.lock().unwrap().rss_kib())
    });

    let steps = Mutex::new(0u32);
    let strategy = open_strategy(closed_port, held_id.clone());
    let sequences = support::fuzz::try_run(
        "relay_open_sequences",
        support::fuzz::config(64),
        &strategy,
        |seq| {
            rt.block_on(async {
                for op in &seq {
                    match op.clone() {
                        Open::Unregistered(id, t) => {
                            let _ = gw.state.open_relay_with_id(id, t, false).await;
                        }
                        Open::Registered(id, t) => {
                            // Claimed relays are dropped at once; a refusal is fine too.
                            let _ = gw.state.open_relay_with_id(id, t, true).await;
                        }
                    }
                }
            });
            *steps.lock().unwrap() += seq.len() as u32;
            let mut s = sup.lock().unwrap();
            prop_assert!(s.try_status().is_none(), "supervisor died:\n{}", s.log());
            Ok(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", sup.lock().unwrap().log()));

    let results = gw.state.seen().relay_results;
    for r in results.iter().filter(|r| !r.success) {
        assert!(
            !r.error.trim().is_empty(),
            "a refusal without a reason: {r:?}"
        );
    }
    let refused = results.iter().filter(|r| !r.success).count();
    rt.block_on(async {
        // No relay slot leaked: with the held one, exactly MAX_EXECS may be open at once. The
        // dropped relays end asynchronously, so wait (bounded) for the slots to come back.
        let deadline = Instant::now() + LONG;
        let mut extra = Vec::new();
        while extra.len() < MAX_EXECS - 1 {
            match gw.state.open_relay(ssh_target()).await {
                Ok(r) => extra.push(bridge(r)),
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "only {} of {} relay slots free after the run: {e:?}\n{}",
                        extra.len() + 1,
                        MAX_EXECS,
                        sup.lock().unwrap().log()
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        drop(extra);
    });
    let rss = rt.block_on(async {
        // The slots just taken are released asynchronously too.
        let deadline = Instant::now() + LONG;
        loop {
            let r = gw.sh("echo hello").await;
            if r.exit == Some(0) || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_serving(&gw, &sup, baseline).await
    });
    eprintln!(
        "{} RelayOpen messages in {} sequences; {refused} refused, each with a reason; RSS {baseline} -> {rss} KiB; exec still prints hello",
        steps.lock().unwrap(),
        sequences
    );
}

// ---------------------------------------------------------------------------------------------
// GatewayMessage / RelayFrame bytes through the generated decoder

/// No input may panic the decoder; whatever decodes must survive a re-encode unchanged.
fn check_frames(bytes: &[u8]) -> Result<(), TestCaseError> {
    use prost::Message;
    if let Ok(m) = GatewayMessage::decode(bytes) {
        prop_assert_eq!(GatewayMessage::decode(&m.encode_to_vec()[..]).ok(), Some(m));
    }
    if let Ok(f) = RelayFrame::decode(bytes) {
        prop_assert_eq!(RelayFrame::decode(&f.encode_to_vec()[..]).ok(), Some(f));
    }
    Ok(())
}

/// A field header (any field number and wire type), a length claiming up to 2^64 bytes, and a
/// short body: the declared length must be checked against what is there, never allocated.
fn claimed_lengths() -> impl Strategy<Value = Vec<u8>> {
    (
        1u64..16,
        0u64..6,
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..32),
    )
        .prop_map(|(field, wire, len, body)| {
            let mut v = Vec::new();
            prost::encoding::encode_varint(field << 3 | wire, &mut v);
            prost::encoding::encode_varint(len, &mut v);
            v.extend(body);
            v
        })
}

#[test]
fn gateway_frame_seeds() {
    for (name, bytes) in support::fuzz::corpus("gateway_frames") {
        if let Err(e) = check_frames(&bytes) {
            panic!("seed {name}: {e}");
        }
    }
}

#[test]
fn gateway_frames_arbitrary() {
    support::fuzz::run(
        "gateway_frames_arbitrary",
        support::fuzz::config(4000),
        &prop::collection::vec(any::<u8>(), 0..256),
        |bytes| check_frames(&bytes),
    );
}

#[test]
fn gateway_frames_claimed_lengths() {
    support::fuzz::run(
        "gateway_frames_claimed_lengths",
        support::fuzz::config(4000),
        &claimed_lengths(),
        |bytes| {
            check_frames(&bytes)?;
            use prost::Message;
            // A declared length beyond the buffer is an error, not a truncated success.
            if bytes.len() < 64 && (bytes[0] & 7) == 2 {
                let declared = prost::encoding::decode_varint(&mut &bytes[1..]).unwrap_or(0);
                if declared > 64 {
                    prop_assert!(GatewayMessage::decode(&bytes[..]).is_err());
                    prop_assert!(RelayFrame::decode(&bytes[..]).is_err());
                }
            }
            Ok(())
        },
    );
}
