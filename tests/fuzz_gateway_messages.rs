//! Fuzzing everything the gateway side can send on the two response streams: the
//! real binary against a raw h2 gateway (tests/support/raw_gateway.rs) that puts arbitrary
//! bytes on ConnectSupervisor and RelayStream responses, then ends them in arbitrary ways.
//!
//! Each case accepts a session, sends a generated sequence (valid messages, duplicate
//! SessionAccepted, SessionRejected, RelayClose, RelayOpen with odd ids and targets, unknown
//! oneof fields of any wire type, garbage bodies, raw garbage, headers declaring up to
//! `u32::MAX` bytes, compressed flags, truncated frames, and claimed relays whose responses get
//! the same treatment), then ends the stream. After every case:
//! - the supervisor is alive;
//! - if the model (tests/support/fuzz/gateway_messages.rs) says the input must end the session, the
//!   supervisor comes back with a new hello on its own; if it says the session survives, that
//!   session still answers a RelayOpen with RelayOpenResult{success} and a RelayStream `init`;
//! - a relay ends once the gateway ends its response, and a TCP relay delivers exactly the data
//!   frames before the first frame that ends it;
//! - after the gateway ends the stream, a new session arrives within a bound.
//!
//! After the run, the supervisor's peak RSS (VmHWM) is below 64 MiB: declared lengths are never
//! allocated beyond the 4 MiB decode limit. Seeds: fuzz/corpus/gateway_messages (format in
//! tests/support/fuzz/gateway_messages.rs). No root needed: without it the supervisor runs with
//! --allow-degraded, as in the other protocol tests.

mod support;
use support::fuzz::runtime;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use gm::{Case, RelayScript, SessionModel, Step, Target, Verdict};
use openshell_sandbox::proto::v1::*;
use proptest::test_runner::TestCaseError;
use support::fuzz::gateway_messages as gm;
use support::raw_gateway::{
    CONNECT_SUPERVISOR, Call, Ending, Head, Outbound, RELAY_STREAM, RawGateway, header,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::timeout;

const BIN: &str = env!("CARGO_BIN_EXE_openshell-sandbox");
const SANDBOX_ID: &str = "0b7f7a4e-6c2d-4f7e-9a51-3d1f2b8c9e10";
/// The supervisor reconnects within 200 ms (`--reconnect-max-ms`) and gives a session that
/// never answers its hello 2 s (`--hello-timeout`); everything else is immediate. The bounds
/// leave room for a loaded 2-core machine.
const NEW_SESSION: Duration = Duration::from_secs(10);
const ANSWER: Duration = Duration::from_secs(10);
/// Peak RSS bound for a whole run: a few times the ~25 MiB the supervisor needs, far below
/// what one honoured 1 GiB declared length would cost.
const PEAK_KIB: u64 = 64 * 1024;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Sup {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sup {
    fn start(endpoint: &str) -> Sup {
        let dir = tempfile::Builder::new()
            .prefix("osb-fuzz-msgs-")
            .tempdir()
            .unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let log = dir.path().join("supervisor.log");
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("OPENSHELL_ENDPOINT", endpoint)
            .env("OPENSHELL_SANDBOX_ID", SANDBOX_ID)
            .env("OPENSHELL_LOG_LEVEL", "info")
            .arg("--workdir")
            .arg(&work)
            .args(["--reconnect-base-ms", "20", "--reconnect-max-ms", "200"])
            .args(["--hello-timeout", "2"])
            // A TCP relay reaches the sandbox's loopback; sharing our network namespace makes
            // the test's echo server that loopback (the relay bytes are what is fuzzed here,
            // not the namespace: gateway_forward_netns.rs tests that).
            .args(["--network", "all"])
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        if !is_root() {
            eprintln!("NOTE: not root, so the supervisor runs with --allow-degraded");
            cmd.arg("--allow-degraded");
        }
        Sup {
            child: cmd.spawn().expect("starting the supervisor binary"),
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            r => Err(format!("supervisor exited: {r:?}")),
        }
    }

    /// Peak resident set size (VmHWM), KiB.
    fn peak_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Sup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback echo server: the target of TCP relays, so relayed bytes can be checked.
async fn echo_server() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = s.into_split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = wr.shutdown().await;
            });
        }
    });
    port
}

#[derive(Default, Debug)]
struct Stats {
    cases: u64,
    steps: u64,
    bytes: u64,
    relays: u64,
    probes: u64,
    /// Sessions the model said the input must end, and the supervisor did end on its own.
    ended_by_input: u64,
}

struct Harness {
    gw: RawGateway,
    sup: Sup,
    echo: u16,
    closed: u16,
    /// The next session: its hello read, no response sent yet.
    pending: Option<Call>,
    instance_id: String,
    relay_seq: u64,
    stats: Stats,
}

type Inbox = mpsc::UnboundedReceiver<Result<SupervisorMessage, String>>;

/// Wait for a ConnectSupervisor call and read its hello. RelayStream calls that arrive
/// meanwhile (relays of odd RelayOpens) are refused as the real gateway refuses unknown ids.
async fn next_session(gw: &mut RawGateway, limit: Duration) -> Result<(Call, String), String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut call = gw
            .next_call(left)
            .await
            .ok_or_else(|| format!("no new session (hello) within {limit:?}"))?;
        if call.path != CONNECT_SUPERVISOR {
            refuse(call);
            continue;
        }
        let first = timeout(ANSWER, call.inbound.next::<SupervisorMessage>())
            .await
            .map_err(|_| "a session opened but no hello followed".to_string())??;
        return match first.and_then(|m| m.payload) {
            Some(supervisor_message::Payload::Hello(h)) if h.sandbox_id == SANDBOX_ID => {
                Ok((call, h.instance_id))
            }
            other => Err(format!(
                "first message of a session is not the hello: {other:?}"
            )),
        };
    }
}

fn refuse(call: Call) {
    call.responder.start(&Head::TrailersOnly(
        5,
        "unknown or expired relay channel".into(),
    ));
}

/// The RelayStream call whose `init` names `id`; others are refused.
async fn next_relay(gw: &mut RawGateway, id: &str) -> Result<Call, String> {
    let deadline = tokio::time::Instant::now() + ANSWER;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut call = gw
            .next_call(left)
            .await
            .ok_or_else(|| format!("no RelayStream for {id} within {ANSWER:?}"))?;
        if call.path == CONNECT_SUPERVISOR {
            return Err(format!(
                "a new session started while relay {id} was expected: the supervisor ended a session the model says survives"
            ));
        }
        if call.path != RELAY_STREAM {
            // A unary call made beside the session (GetSandboxProviderEnvironment): this
            // gateway does not implement it, as a v0.0.36 one does not.
            call.responder
                .start(&Head::TrailersOnly(12, "unimplemented".into()));
            continue;
        }
        let init = timeout(ANSWER, call.inbound.next::<RelayFrame>()).await;
        match init {
            Ok(Ok(Some(RelayFrame {
                payload: Some(relay_frame::Payload::Init(i)),
            }))) if i.channel_id == id => return Ok(call),
            Ok(Ok(Some(RelayFrame {
                payload: Some(relay_frame::Payload::Init(_)),
            }))) => refuse(call),
            other => return Err(format!("a RelayStream did not start with init: {other:?}")),
        }
    }
}

async fn relay_result(inbox: &mut Inbox, id: &str) -> Result<RelayOpenResult, String> {
    let deadline = tokio::time::Instant::now() + ANSWER;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let m = timeout(left, inbox.recv())
            .await
            .map_err(|_| format!("no RelayOpenResult for {id} within {ANSWER:?}"))?
            .ok_or("session reader gone")?
            .map_err(|e| format!("control stream ended while waiting for {id}: {e}"))?;
        if let Some(supervisor_message::Payload::RelayOpenResult(r)) = m.payload
            && r.channel_id == id
        {
            return Ok(r);
        }
    }
}

impl Harness {
    async fn start() -> Harness {
        let mut gw = RawGateway::start().await;
        let sup = Sup::start(&gw.endpoint());
        let echo = echo_server().await;
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (call, instance_id) = next_session(&mut gw, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", sup.tail()));
        Harness {
            gw,
            sup,
            echo,
            closed,
            pending: Some(call),
            instance_id,
            relay_seq: 0,
            stats: Stats::default(),
        }
    }

    /// A RelayOpen the supervisor must claim, then the scripted response; `Ok` once the relay
    /// ended on the supervisor's side.
    async fn relay(
        &mut self,
        out: &mut Outbound,
        inbox: &mut Inbox,
        model: &mut SessionModel,
        script: &RelayScript,
    ) -> Result<(), String> {
        self.relay_seq += 1;
        let id = format!("script-{}", self.relay_seq);
        let target = match script.target {
            Target::Ssh => Some(relay_open::Target::Ssh(SshRelayTarget {})),
            Target::Absent => None,
            Target::Echo => Some(relay_open::Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".into(),
                port: u32::from(self.echo),
            })),
        };
        let open = gm::relay_open(&id, target);
        model.feed(&open);
        out.raw(open)
            .map_err(|e| format!("control stream gone: {e}"))?;
        let r = relay_result(inbox, &id).await?;
        if !r.success {
            return Err(format!("relay {id} to {:?} refused: {r:?}", script.target));
        }
        let call = next_relay(&mut self.gw, &id).await?;
        let Some(mut rout) = call.responder.start(&Head::Grpc) else {
            return Err(format!(
                "relay {id}: the supervisor reset it before the response"
            ));
        };
        let mut inbound = call.inbound;
        let back = tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                match inbound.next::<RelayFrame>().await {
                    Ok(Some(RelayFrame {
                        payload: Some(relay_frame::Payload::Data(d)),
                    })) => got.extend_from_slice(&d),
                    Ok(Some(f)) => return Err(format!("supervisor sent {f:?} after init")),
                    Ok(None) | Err(_) => return Ok(got),
                }
            }
        });
        for c in &script.chunks {
            let _ = rout.raw(c.clone());
        }
        rout.end(&script.ending);
        let got = timeout(Duration::from_secs(15), back)
            .await
            .map_err(|_| {
                format!("relay {id} still open 15 s after the gateway ended it: {script:?}")
            })?
            .unwrap()?;
        if script.target == Target::Echo {
            let (want, whole) = gm::relay_delivery(&script.chunks);
            if !want.starts_with(&got) {
                return Err(format!(
                    "relay {id}: the target got bytes the gateway never sent in a data frame before the first bad frame: {} bytes back, {} expected",
                    got.len(),
                    want.len()
                ));
            }
            if whole && script.ending == Ending::ok() && got != want {
                return Err(format!(
                    "relay {id}: {} of {} bytes came back after a clean end",
                    got.len(),
                    want.len()
                ));
            }
        }
        self.stats.relays += 1;
        Ok(())
    }

    async fn run(&mut self, case: &Case) -> Result<(), String> {
        self.sup.alive()?;
        let call = match self.pending.take() {
            Some(c) => c,
            // A previous case failed half-way (while proptest shrinks): start from whatever
            // session the supervisor opens next.
            None => next_session(&mut self.gw, NEW_SESSION).await?.0,
        };
        let mut model = SessionModel::new(&case.head);
        let mut out = call.responder.start(&case.head);
        let (tx, mut inbox) = mpsc::unbounded_channel();
        let mut inbound = call.inbound;
        tokio::spawn(async move {
            loop {
                let m = inbound.next::<SupervisorMessage>().await;
                let end = !matches!(m, Ok(Some(_)));
                let _ = tx.send(m.and_then(|m| m.ok_or_else(|| "ended".to_string())));
                if end {
                    return;
                }
            }
        });
        for step in &case.steps {
            self.stats.steps += 1;
            match (step, out.as_mut()) {
                (Step::Relay(script), Some(o)) if model.serving() => {
                    self.relay(o, &mut inbox, &mut model, script).await?
                }
                // Not serving: the RelayOpen is just more bytes in whatever state the stream is.
                (Step::Relay(_), o) => {
                    let b = gm::relay_open("never-answered", None);
                    model.feed(&b);
                    if let Some(o) = o {
                        let _ = o.raw(b);
                    }
                }
                (Step::Bytes(b), o) => {
                    self.stats.bytes += b.len() as u64;
                    model.feed(b);
                    if let Some(o) = o {
                        let _ = o.raw(b.clone());
                    }
                }
            }
        }
        let mut next = None;
        match (&model.verdict, out.as_mut()) {
            (Verdict::Alive, Some(o)) if model.accepted() => {
                let probe = RelayScript {
                    target: Target::Ssh,
                    chunks: Vec::new(),
                    ending: Ending::ok(),
                };
                self.relay(o, &mut inbox, &mut model, &probe)
                    .await
                    .map_err(|e| format!("the session did not survive the input: {e}"))?;
                self.stats.probes += 1;
            }
            (Verdict::Dead(why), _) => {
                let s = next_session(&mut self.gw, NEW_SESSION)
                    .await
                    .map_err(|e| format!("the input must end the session ({why}), but: {e}"))?;
                self.stats.ended_by_input += 1;
                next = Some(s);
            }
            _ => {}
        }
        if let Some(o) = out {
            o.end(&case.ending);
        }
        let (call, instance) = match next {
            Some(s) => s,
            None => next_session(&mut self.gw, NEW_SESSION).await.map_err(|e| {
                format!(
                    "after the gateway ended the stream ({:?}): {e}",
                    case.ending
                )
            })?,
        };
        if instance != self.instance_id {
            return Err(format!(
                "instance_id changed across reconnects: {} -> {instance}",
                self.instance_id
            ));
        }
        self.pending = Some(call);
        self.stats.cases += 1;
        self.sup.alive()
    }
}

fn check_peak(h: &Harness, before: u64) {
    let after = h.sup.peak_kib();
    eprintln!(
        "supervisor VmHWM {before} KiB -> {after} KiB; {:?}",
        h.stats
    );
    assert!(
        after < PEAK_KIB,
        "supervisor peak RSS {after} KiB over the {PEAK_KIB} KiB bound (VmHWM {before} KiB before)"
    );
}

#[test]
fn gateway_messages_seeds() {
    let rt = runtime();
    let mut h = rt.block_on(Harness::start());
    let before = h.sup.peak_kib();
    for (name, bytes) in support::fuzz::corpus("gateway_messages") {
        let text = String::from_utf8(bytes).unwrap();
        let case =
            gm::parse_seed(&text, h.echo, h.closed).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        if let Err(e) = rt.block_on(h.run(&case)) {
            panic!(
                "seed {name}: {e}\n{case:?}\nsupervisor log:\n{}",
                h.sup.tail()
            );
        }
    }
    check_peak(&h, before);
}

#[test]
fn gateway_messages_sequences() {
    let rt = runtime();
    let h = rt.block_on(Harness::start());
    let before = h.sup.peak_kib();
    let strategy = gm::case(h.echo, h.closed);
    let h = Mutex::new(h);
    let mut config = support::fuzz::config(40);
    // No shrinking: a case's outcome depends on the live supervisor's state after the cases
    // before it, so a "smaller" rerun on a session the failure left behind shows nothing
    // useful. The input printed is the one that failed.
    config.max_shrink_iters = 0;
    let n = support::fuzz::run("gateway_messages", config, &strategy, |case| {
        let mut h = h.lock().unwrap();
        rt.block_on(h.run(&case))
            .map_err(|e| TestCaseError::fail(format!("{e}\nsupervisor log:\n{}", h.sup.tail())))
    });
    let h = h.into_inner().unwrap();
    eprintln!("{n} generated sequences");
    check_peak(&h, before);
}

/// Frames declaring 4 MiB + 1, 1 GiB and `u32::MAX` bytes, on the control stream and on a
/// relay: each ends its stream with a log line naming the length, and none is allocated.
#[test]
fn oversized_declared_lengths_are_refused_without_allocation() {
    let rt = runtime();
    let mut h = rt.block_on(Harness::start());
    let accept = Step::Bytes(gm::accepted(15));
    // Warm up first (SSH server, relay paths), so the peak below is the inputs' doing.
    let warm = Case {
        head: Head::Grpc,
        steps: vec![accept.clone()],
        ending: Ending::ok(),
    };
    rt.block_on(h.run(&warm)).unwrap();
    rt.block_on(h.run(&warm)).unwrap();
    let before = h.sup.peak_kib();
    for len in [gm::LIMIT as u32 + 1, 1 << 30, u32::MAX] {
        let huge = [header(0, len).to_vec(), vec![0x5a; 64]].concat();
        let control = Case {
            head: Head::Grpc,
            steps: vec![accept.clone(), Step::Bytes(huge.clone())],
            ending: Ending::ok(),
        };
        let relay = Case {
            head: Head::Grpc,
            steps: vec![
                accept.clone(),
                Step::Relay(RelayScript {
                    target: Target::Ssh,
                    chunks: vec![huge],
                    ending: Ending::ok(),
                }),
            ],
            ending: Ending::ok(),
        };
        for case in [control, relay] {
            if let Err(e) = rt.block_on(h.run(&case)) {
                panic!("{len}: {e}\n{}", h.sup.tail());
            }
        }
        // One line each that says what happened and names the length: for the session, that
        // the gateway sent too much (not that it "refused the session"); for the relay, that
        // the SSH connection over it ended (the relay is the SSH server's transport).
        let log = h.sup.log();
        let found = format!("found {len} bytes");
        for what in [
            "gateway session: the gateway sent a message over the 4 MiB limit",
            "over the relay",
        ] {
            let line = log
                .lines()
                .find(|l| l.contains(what) && l.contains(&found))
                .unwrap_or_else(|| {
                    panic!("no log line with {what:?} and {found:?}:\n{}", h.sup.tail())
                });
            eprintln!("{len}: {line}");
        }
    }
    let after = h.sup.peak_kib();
    eprintln!("VmHWM {before} KiB -> {after} KiB across six oversized frames");
    assert!(
        after.saturating_sub(before) < 4 * 1024,
        "VmHWM grew by {} KiB ({before} -> {after}) for frames that must not be allocated",
        after - before
    );
}

#[test]
fn seed_format_parses_every_instruction() {
    let text = "head grpc\naccept 15\nheartbeat\nrejected no\nclose a b\nopen ssh x\nopen none y\nopen tcp 127.0.0.1 echo z\nunknown 7 2 0102\nbody 0800\nraw ff\nheader 0 4194305 00\nrelay echo\nr data 6869\nr body -\nr raw 00\nr header 1 3 000000\nr init q\nrelay-end trailers 13 boom\nend reset 8\n";
    let c = gm::parse_seed(text, 1, 2).unwrap();
    assert_eq!(c.steps.len(), 12);
    assert_eq!(c.ending, Ending::Reset(8));
    assert!(gm::parse_seed("accept 15\n", 1, 2).is_err(), "no end");
    assert!(gm::parse_seed("bogus\nend ok\n", 1, 2).is_err());
    // The model reads a real stream the way the supervisor must.
    let mut m = SessionModel::new(&Head::Grpc);
    m.feed(&gm::accepted(15));
    assert!(m.serving());
    m.feed(&gm::gateway(gateway_message::Payload::Heartbeat(GatewayHeartbeat {}))[..3]);
    assert_eq!(m.verdict, Verdict::Pending);
    let mut m = SessionModel::new(&Head::Grpc);
    m.feed(&gm::accepted(15));
    m.feed(&header(0, u32::MAX));
    assert!(matches!(m.verdict, Verdict::Dead(_)));
}
