//! The `gateway_messages` fuzz target's inputs: what a hostile gateway puts on the
//! ConnectSupervisor response stream, a model of what the supervisor must make of it, the
//! proptest strategies, and the seed corpus format.
//!
//! The model is written from the contract, not from the supervisor: gRPC framing as any gRPC
//! client must read it (flag 0 or 1, 4-byte big-endian length, our 4 MiB decode limit, no
//! compression negotiated) and the session rules of src/gateway/session.rs (the first message
//! must be SessionAccepted; SessionRejected and any undecodable message end the session;
//! everything else, unknown payloads included, is skipped or handled without ending it).
//!
//! Included by tests/fuzz_gateway_messages.rs with `#[path]`.
#![allow(dead_code)]

use openshell_sandbox::proto::v1::*;
use proptest::prelude::*;
use prost::Message;

use crate::support::raw_gateway::{Ending, Head, frame, header};

/// The supervisor's decode limit (src/gateway/channel.rs, `max_decoding_message_size`).
pub const LIMIT: usize = 4 << 20;

/// One input: how the response starts, what follows, how it ends.
#[derive(Debug, Clone)]
pub struct Case {
    pub head: Head,
    pub steps: Vec<Step>,
    pub ending: Ending,
}

#[derive(Debug, Clone)]
pub enum Step {
    /// Bytes on the ConnectSupervisor response stream as they are: whole frames, garbage,
    /// headers declaring any length.
    Bytes(Vec<u8>),
    /// A RelayOpen the supervisor must claim, then a scripted RelayStream response.
    Relay(RelayScript),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Ssh,
    /// No `target` at all: the supervisor must treat it as SSH.
    Absent,
    /// TCP to the test's loopback echo server.
    Echo,
}

#[derive(Debug, Clone)]
pub struct RelayScript {
    pub target: Target,
    /// Bytes on the RelayStream response, in order.
    pub chunks: Vec<Vec<u8>>,
    pub ending: Ending,
}

pub fn gateway(p: gateway_message::Payload) -> Vec<u8> {
    frame(&GatewayMessage { payload: Some(p) }.encode_to_vec())
}

pub fn accepted(secs: u32) -> Vec<u8> {
    gateway(gateway_message::Payload::SessionAccepted(SessionAccepted {
        session_id: "fuzz".into(),
        heartbeat_interval_secs: secs,
    }))
}

pub fn relay_open(id: &str, target: Option<relay_open::Target>) -> Vec<u8> {
    gateway(gateway_message::Payload::RelayOpen(RelayOpen {
        channel_id: id.into(),
        target,
        service_id: String::new(),
    }))
}

pub fn data(d: &[u8]) -> Vec<u8> {
    frame(
        &RelayFrame {
            payload: Some(relay_frame::Payload::Data(d.to_vec().into())),
        }
        .encode_to_vec(),
    )
}

/// A field this build does not know: its tag, then a body shaped by the wire type.
pub fn unknown_field(field: u32, wire: u32, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    prost::encoding::encode_varint(u64::from(field << 3 | wire), &mut v);
    match wire {
        // A length-delimited field carries its own length; the rest is taken as it comes.
        2 => {
            prost::encoding::encode_varint(body.len() as u64, &mut v);
            v.extend_from_slice(body);
        }
        _ => v.extend_from_slice(body),
    }
    v
}

// ---------------------------------------------------------------------------------------------
// The model

/// Where a response stream stands after some bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Between frames and still in use.
    Alive,
    /// Inside a frame: the supervisor is waiting for more bytes.
    Pending,
    /// The supervisor must have ended the stream, for this reason.
    Dead(String),
    /// The head is one whose handling the gRPC client decides (non-200, non-gRPC type).
    Unsure,
}

/// gRPC framing and the session rules, fed the bytes of one ConnectSupervisor response.
pub struct SessionModel {
    buf: Vec<u8>,
    accepted: bool,
    pub verdict: Verdict,
}

/// One frame off the front of `buf`: `Ok(None)` when incomplete, `Err` when the header alone
/// must end the stream.
fn take_frame(buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
    if buf.len() < 5 {
        return Ok(None);
    }
    match buf[0] {
        0 => {}
        1 => return Err("compressed flag without a negotiated encoding".into()),
        f => return Err(format!("invalid compressed flag {f}")),
    }
    let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
    if len > LIMIT {
        return Err(format!("declared length {len} over the 4 MiB limit"));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let body = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some(body))
}

impl SessionModel {
    pub fn new(head: &Head) -> SessionModel {
        let verdict = match head {
            Head::Grpc => Verdict::Alive,
            // tonic reads the messages of a non-200 response that claims to be gRPC and maps the
            // HTTP status only when the stream ends without grpc-status; nor does it check the
            // content type. Either may or may not end the session, so nothing is predicted.
            Head::ContentType(_) | Head::HttpStatus(_) => Verdict::Unsure,
            Head::TrailersOnly(c, _) => Verdict::Dead(format!("trailers-only status {c}")),
        };
        SessionModel {
            buf: Vec::new(),
            accepted: false,
            verdict,
        }
    }

    pub fn accepted(&self) -> bool {
        self.accepted
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        if !matches!(self.verdict, Verdict::Alive | Verdict::Pending) {
            return;
        }
        self.buf.extend_from_slice(bytes);
        loop {
            let body = match take_frame(&mut self.buf) {
                Ok(Some(b)) => b,
                Ok(None) => break,
                Err(e) => {
                    self.verdict = Verdict::Dead(e);
                    return;
                }
            };
            let payload = match GatewayMessage::decode(&body[..]) {
                Ok(m) => m.payload,
                Err(e) => {
                    self.verdict = Verdict::Dead(format!("undecodable GatewayMessage: {e}"));
                    return;
                }
            };
            use gateway_message::Payload as P;
            match (self.accepted, payload) {
                (false, Some(P::SessionAccepted(_))) => self.accepted = true,
                (_, Some(P::SessionRejected(_))) => {
                    self.verdict = Verdict::Dead("SessionRejected".into());
                    return;
                }
                (false, _) => {
                    self.verdict = Verdict::Dead("first message not SessionAccepted".into());
                    return;
                }
                (true, _) => {}
            }
        }
        self.verdict = if self.buf.is_empty() {
            Verdict::Alive
        } else {
            Verdict::Pending
        };
    }

    /// Between frames, accepted: a RelayOpen sent now must be answered.
    pub fn serving(&self) -> bool {
        self.accepted && self.verdict == Verdict::Alive
    }
}

/// The data a relay must deliver to its target: every data frame before the first frame that
/// ends the relay. The flag is true when nothing ended it early, so with OK trailers the
/// target must get all of it.
pub fn relay_delivery(chunks: &[Vec<u8>]) -> (Vec<u8>, bool) {
    let mut buf: Vec<u8> = chunks.concat();
    let mut out = Vec::new();
    loop {
        match take_frame(&mut buf) {
            Ok(Some(body)) => match RelayFrame::decode(&body[..]) {
                Ok(RelayFrame {
                    payload: Some(relay_frame::Payload::Data(d)),
                }) => out.extend_from_slice(&d),
                _ => return (out, false),
            },
            Ok(None) => return (out, buf.is_empty()),
            Err(_) => return (out, false),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies

fn odd_id() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9-]{1,12}",
        ".{0,24}",
        "x{300,400}",
    ]
}

fn odd_target(echo: u16, closed: u16) -> impl Strategy<Value = Option<relay_open::Target>> {
    let tcp =
        |host: String, port: u32| Some(relay_open::Target::Tcp(TcpRelayTarget { host, port }));
    prop_oneof![
        Just(None),
        Just(Some(relay_open::Target::Ssh(SshRelayTarget {}))),
        (
            prop::sample::select(vec!["127.0.0.1", "localhost", "::1", "10.0.0.1", ""]),
            prop::sample::select(vec![u32::from(echo), u32::from(closed), 0, 70000]),
        )
            .prop_map(move |(h, p)| tcp(h.into(), p)),
    ]
}

/// A message body with one unknown field (6..=50, any wire type), sometimes after a known one.
fn unknown_body() -> impl Strategy<Value = Vec<u8>> {
    (
        6u32..=50,
        0u32..8,
        prop::collection::vec(any::<u8>(), 0..16),
        prop::option::of(Just(GatewayMessage {
            payload: Some(gateway_message::Payload::Heartbeat(GatewayHeartbeat {})),
        })),
    )
        .prop_map(|(field, wire, body, known)| {
            let mut v = known.map(|m| m.encode_to_vec()).unwrap_or_default();
            v.extend(unknown_field(field, wire, &body));
            v
        })
}

/// A header declaring more than the limit (or just under it), followed by a short body.
fn declared_length() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            Just(LIMIT as u32 + 1),
            Just(1u32 << 30),
            Just(u32::MAX),
            (LIMIT as u32 + 1)..=u32::MAX,
            // Within the limit: the supervisor may reserve it, then waits for the rest.
            (64u32 << 10)..=(LIMIT as u32),
        ],
        prop::collection::vec(any::<u8>(), 0..32),
    )
        .prop_map(|(len, body)| [header(0, len).to_vec(), body].concat())
}

fn compressed() -> impl Strategy<Value = Vec<u8>> {
    (1u8..=255, prop::collection::vec(any::<u8>(), 0..16))
        .prop_map(|(flag, body)| [header(flag, body.len() as u32).to_vec(), body].concat())
}

fn truncated(whole: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let n = whole.len();
    (1..n).prop_map(move |cut| whole[..cut].to_vec())
}

/// One step of bytes on the control stream.
pub fn control_bytes(echo: u16, closed: u16) -> impl Strategy<Value = Vec<u8>> {
    use gateway_message::Payload as P;
    // About one step in five ends the session, so most cases still reach a later step.
    prop_oneof![
        6 => Just(gateway(P::Heartbeat(GatewayHeartbeat {}))),
        2 => (".{0,40}", any::<u32>()).prop_map(|(session_id, heartbeat_interval_secs)| {
            gateway(P::SessionAccepted(SessionAccepted { session_id, heartbeat_interval_secs }))
        }),
        1 => ".{0,60}".prop_map(|reason| gateway(P::SessionRejected(SessionRejected { reason }))),
        2 => (odd_id(), ".{0,40}").prop_map(|(channel_id, reason)| {
            gateway(P::RelayClose(RelayClose { channel_id, reason }))
        }),
        3 => (odd_id(), odd_target(echo, closed)).prop_map(|(id, t)| relay_open(&id, t)),
        4 => unknown_body().prop_map(|b| frame(&b)),
        1 => Just(frame(&[])),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(|b| frame(&b)),
        1 => prop::collection::vec(any::<u8>(), 1..24),
        1 => declared_length(),
        1 => compressed(),
        1 => truncated(gateway(P::Heartbeat(GatewayHeartbeat {})).into_iter().chain(*b"xx").collect()),
        1 => truncated(accepted(15)),
    ]
}

/// One chunk of bytes on a RelayStream response.
fn relay_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => prop::collection::vec(any::<u8>(), 0..512).prop_map(|d| data(&d)),
        1 => ".{0,24}".prop_map(|channel_id| frame(&RelayFrame {
            payload: Some(relay_frame::Payload::Init(RelayInit { channel_id })),
        }.encode_to_vec())),
        1 => Just(frame(&[])),
        1 => unknown_body().prop_map(|b| frame(&b)),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(|b| frame(&b)),
        1 => prop::collection::vec(any::<u8>(), 1..24),
        1 => declared_length(),
        1 => compressed(),
        1 => truncated(data(b"truncated")),
    ]
}

fn relay_ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        4 => Just(Ending::ok()),
        2 => trailers(),
        1 => Just(Ending::NoTrailers),
        1 => reset_code().prop_map(Ending::Reset),
    ]
}

fn reset_code() -> impl Strategy<Value = u32> {
    prop_oneof![
        prop::sample::select(vec![0u32, 1, 2, 7, 8, 11, 13]),
        any::<u32>()
    ]
}

fn trailers() -> impl Strategy<Value = Ending> {
    (
        prop::option::of(prop::sample::select(vec![
            "0", "1", "2", "4", "13", "14", "16", "17", "999", "-1", "x", "",
        ])),
        prop::option::of(".{0,30}"),
    )
        .prop_map(|(status, message)| Ending::Trailers {
            status: status.map(String::from),
            message,
        })
}

pub fn control_ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        3 => Just(Ending::ok()),
        3 => trailers(),
        1 => Just(Ending::NoTrailers),
        2 => reset_code().prop_map(Ending::Reset),
        1 => prop::sample::select(vec![0u32, 1, 2, 11]).prop_map(Ending::GoAway),
        1 => Just(Ending::Cut),
    ]
}

fn head() -> impl Strategy<Value = Head> {
    prop_oneof![
        20 => Just(Head::Grpc),
        1 => prop::sample::select(vec![400u16, 404, 500, 503]).prop_map(Head::HttpStatus),
        1 => (0u32..=17, ".{0,20}").prop_map(|(c, m)| Head::TrailersOnly(c, m)),
        1 => prop::sample::select(vec!["text/html", "application/json", ""])
            .prop_map(|c| Head::ContentType(c.into())),
    ]
}

pub fn case(echo: u16, closed: u16) -> impl Strategy<Value = Case> {
    let step = prop_oneof![
        6 => control_bytes(echo, closed).prop_map(Step::Bytes),
        1 => (
            prop::sample::select(vec![Target::Ssh, Target::Absent, Target::Echo]),
            prop::collection::vec(relay_bytes(), 0..6),
            relay_ending(),
        )
            .prop_map(|(target, chunks, ending)| Step::Relay(RelayScript { target, chunks, ending })),
    ];
    (
        head(),
        prop_oneof![
            12 => prop::sample::select(vec![0u32, 1, 5, 15, u32::MAX]).prop_map(|s| Some(accepted(s))),
            1 => Just(None),
        ],
        prop::collection::vec(step, 0..8),
        control_ending(),
    )
        .prop_map(|(head, accept, mut steps, ending)| {
            if let Some(a) = accept {
                steps.insert(0, Step::Bytes(a));
            }
            Case {
                head,
                steps,
                ending,
            }
        })
}

// ---------------------------------------------------------------------------------------------
// Seed corpus: fuzz/corpus/gateway_messages/, one case per file, one instruction per line.
//
//   # comment                      blank lines too
//   head grpc | head status N | head trailers-only CODE [MSG] | head content-type VALUE
//   accept SECS                    SessionAccepted{session_id "fuzz", heartbeat_interval_secs}
//   heartbeat                      GatewayHeartbeat
//   rejected [REASON...]           SessionRejected
//   close ID [REASON...]           RelayClose
//   open ssh|none ID               RelayOpen, answered as the supervisor likes
//   open tcp HOST PORT ID          (PORT `echo` / `closed`: the test's own ports)
//   unknown FIELD WIRE HEX         a GatewayMessage holding only that field
//   body HEX                       a well-formed frame around HEX
//   raw HEX                        HEX as it is
//   header FLAG LEN [HEX]          a frame header declaring LEN, then HEX
//   relay ssh|none|echo            a claimed relay; `r` lines script its response:
//   r data HEX | r body HEX | r raw HEX | r header FLAG LEN [HEX] | r init ID
//   relay-end ENDING
//   end ENDING                     required, last
//   ENDING: ok | trailers CODE [MSG] | no-status | no-trailers | reset CODE | goaway CODE | cut
//
// HEX is lowercase hex, `-` for none. Every number is decimal.

fn hex(s: &str) -> Result<Vec<u8>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    hex::decode(s).map_err(|e| format!("hex {s:?}: {e}"))
}

fn num<T: std::str::FromStr>(s: Option<&str>) -> Result<T, String> {
    let s = s.ok_or("missing number")?;
    s.parse().map_err(|_| format!("not a number: {s:?}"))
}

fn ending(words: &[&str]) -> Result<Ending, String> {
    let rest = |i: usize| (words.len() > i).then(|| words[i..].join(" "));
    Ok(match words.first().copied() {
        Some("ok") => Ending::ok(),
        Some("trailers") => Ending::Trailers {
            status: Some(words.get(1).ok_or("trailers needs a code")?.to_string()),
            message: rest(2),
        },
        Some("no-status") => Ending::Trailers {
            status: None,
            message: rest(1),
        },
        Some("no-trailers") => Ending::NoTrailers,
        Some("reset") => Ending::Reset(num(words.get(1).copied())?),
        Some("goaway") => Ending::GoAway(num(words.get(1).copied())?),
        Some("cut") => Ending::Cut,
        w => return Err(format!("unknown ending {w:?}")),
    })
}

pub fn parse_seed(text: &str, echo: u16, closed: u16) -> Result<Case, String> {
    use gateway_message::Payload as P;
    let mut case = Case {
        head: Head::Grpc,
        steps: Vec::new(),
        ending: Ending::ok(),
    };
    let mut relay: Option<RelayScript> = None;
    let mut ended = false;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let rest = |i: usize| w.get(i..).map(|r| r.join(" ")).unwrap_or_default();
        let err = |e: String| format!("line {}: {line:?}: {e}", n + 1);
        if ended {
            return Err(err("after `end`".into()));
        }
        let mut push = |b: Vec<u8>| case.steps.push(Step::Bytes(b));
        match w[0] {
            "head" => {
                case.head = match w.get(1).copied() {
                    Some("grpc") => Head::Grpc,
                    Some("status") => Head::HttpStatus(num(w.get(2).copied()).map_err(err)?),
                    Some("trailers-only") => {
                        Head::TrailersOnly(num(w.get(2).copied()).map_err(err)?, rest(3))
                    }
                    Some("content-type") => Head::ContentType(rest(2)),
                    h => return Err(err(format!("unknown head {h:?}"))),
                }
            }
            "accept" => push(accepted(num(w.get(1).copied()).map_err(err)?)),
            "heartbeat" => push(gateway(P::Heartbeat(GatewayHeartbeat {}))),
            "rejected" => push(gateway(P::SessionRejected(SessionRejected {
                reason: rest(1),
            }))),
            "close" => push(gateway(P::RelayClose(RelayClose {
                channel_id: w.get(1).unwrap_or(&"").to_string(),
                reason: rest(2),
            }))),
            "open" => {
                let (target, id) = match w.get(1).copied() {
                    Some("ssh") => (Some(relay_open::Target::Ssh(SshRelayTarget {})), 2),
                    Some("none") => (None, 2),
                    Some("tcp") => {
                        let port = match w.get(3).copied() {
                            Some("echo") => u32::from(echo),
                            Some("closed") => u32::from(closed),
                            p => num(p).map_err(err)?,
                        };
                        let host = w.get(2).unwrap_or(&"").to_string();
                        let t = TcpRelayTarget { host, port };
                        (Some(relay_open::Target::Tcp(t)), 4)
                    }
                    t => return Err(err(format!("unknown target {t:?}"))),
                };
                push(relay_open(w.get(id).unwrap_or(&""), target))
            }
            "unknown" => {
                let field = num(w.get(1).copied()).map_err(err)?;
                let wire = num(w.get(2).copied()).map_err(err)?;
                let body = hex(w.get(3).unwrap_or(&"-")).map_err(err)?;
                push(frame(&unknown_field(field, wire, &body)))
            }
            "body" => push(frame(&hex(w.get(1).unwrap_or(&"-")).map_err(err)?)),
            "raw" => push(hex(w.get(1).unwrap_or(&"-")).map_err(err)?),
            "header" => {
                let h = header(
                    num(w.get(1).copied()).map_err(err)?,
                    num(w.get(2).copied()).map_err(err)?,
                );
                push([h.to_vec(), hex(w.get(3).unwrap_or(&"-")).map_err(err)?].concat())
            }
            "relay" => {
                let target = match w.get(1).copied() {
                    Some("ssh") => Target::Ssh,
                    Some("none") => Target::Absent,
                    Some("echo") => Target::Echo,
                    t => return Err(err(format!("unknown relay target {t:?}"))),
                };
                relay = Some(RelayScript {
                    target,
                    chunks: Vec::new(),
                    ending: Ending::ok(),
                });
            }
            "r" => {
                let r = relay
                    .as_mut()
                    .ok_or_else(|| err("`r` outside a relay".into()))?;
                let arg = |i: usize| hex(w.get(i).unwrap_or(&"-")).map_err(err);
                let chunk = match w.get(1).copied() {
                    Some("data") => data(&arg(2)?),
                    Some("body") => frame(&arg(2)?),
                    Some("raw") => arg(2)?,
                    Some("header") => {
                        let h = header(
                            num(w.get(2).copied()).map_err(err)?,
                            num(w.get(3).copied()).map_err(err)?,
                        );
                        [h.to_vec(), arg(4)?].concat()
                    }
                    Some("init") => frame(
                        &RelayFrame {
                            payload: Some(relay_frame::Payload::Init(RelayInit {
                                channel_id: rest(2),
                            })),
                        }
                        .encode_to_vec(),
                    ),
                    c => return Err(err(format!("unknown relay chunk {c:?}"))),
                };
                r.chunks.push(chunk);
            }
            "relay-end" => {
                let mut r = relay
                    .take()
                    .ok_or_else(|| err("`relay-end` outside a relay".into()))?;
                r.ending = ending(&w[1..]).map_err(err)?;
                case.steps.push(Step::Relay(r));
            }
            "end" => {
                case.ending = ending(&w[1..]).map_err(err)?;
                ended = true;
            }
            k => return Err(err(format!("unknown instruction {k:?}"))),
        }
    }
    if relay.is_some() {
        return Err("a relay without `relay-end`".into());
    }
    if !ended {
        return Err("no `end` line".into());
    }
    Ok(case)
}
