//! Fuzzing the egress proxy's request parser (`egress::request`), the first thing a hostile
//! client of the proxy reaches:
//!
//! - any bytes: `head_end` and `parse_head` never panic, and whatever is accepted is sane (a
//!   valid host and a non-zero port, an origin-form path, no CR/LF/NUL in any header, one
//!   body framing);
//! - generated well-formed heads parse to exactly their parts;
//! - one defect inserted into a well-formed head (a bare LF or CR, an obs-fold, a control
//!   byte, a second framing header, a fragment, a head past 8 KiB) is always refused.
//!
//! Bounded by case count, or by `OSB_FUZZ_SECONDS` (see tests/fuzz_support). Seeds:
//! fuzz/corpus/egress_request (`ok-*` must parse, `bad-*` must not).

mod support;

use openshell_sandbox::egress::request::{HeadError, MAX_HEAD, Target, head_end, parse_head};
use proptest::prelude::*;

/// What every accepted head must satisfy, whatever the input was.
fn check_accepted(input: &[u8]) -> Result<(), TestCaseError> {
    let Ok(h) = parse_head(input) else {
        return Ok(());
    };
    prop_assert!(input.len() <= MAX_HEAD);
    let host_ok = |h: &str| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
    };
    match &h.target {
        Target::Connect(d) => {
            prop_assert_eq!(h.method.as_str(), "CONNECT");
            prop_assert!(host_ok(&d.host), "{:?}", d);
            prop_assert!(d.port != 0);
        }
        Target::Forward {
            dest,
            authority,
            path_and_query,
        } => {
            prop_assert!(h.method != "CONNECT");
            prop_assert!(host_ok(&dest.host), "{:?}", dest);
            prop_assert!(dest.port != 0);
            prop_assert!(path_and_query.starts_with('/'), "{path_and_query:?}");
            prop_assert!(!path_and_query.contains('#'));
            prop_assert!(!authority.contains('@') && !authority.is_empty());
        }
    }
    for (n, v) in &h.headers {
        prop_assert!(!n.is_empty());
        prop_assert!(!(n.bytes().chain(v.bytes())).any(|b| b == b'\r' || b == b'\n' || b == 0));
    }
    let has = |name: &str| h.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    prop_assert!(!(has("content-length") && has("transfer-encoding")));
    Ok(())
}

#[test]
fn seeds() {
    for (name, bytes) in support::fuzz::corpus("egress_request") {
        let r = parse_head(&bytes);
        if name.starts_with("ok-") {
            assert!(r.is_ok(), "{name}: {r:?}");
        } else {
            assert!(r.is_err(), "{name}: accepted {r:?}");
        }
        check_accepted(&bytes).unwrap();
    }
}

#[test]
fn any_bytes() {
    let bytes = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        // Near-heads: a method and a target, then noise.
        (
            prop::sample::select(vec!["CONNECT ", "GET ", "POST ", "connect ", "GET  "]),
            "[ -~]{0,60}",
            prop::collection::vec(
                prop::sample::select(vec![
                    b'\r', b'\n', b' ', b'\t', b':', b'a', 0, 0x7f, 0xff, b'[', b']', b'#'
                ]),
                0..80
            )
        )
            .prop_map(|(m, t, tail)| {
                let mut v = format!("{m}{t} HTTP/1.1\r\n").into_bytes();
                v.extend(tail);
                v.extend_from_slice(b"\r\n\r\n");
                v
            }),
    ];
    support::fuzz::run(
        "egress_request/any_bytes",
        support::fuzz::config(2000),
        &bytes,
        |b| {
            if let Some(Ok(n)) = head_end(&b) {
                prop_assert!(n <= b.len());
                check_accepted(&b[..n])?;
            }
            check_accepted(&b)
        },
    );
}

#[derive(Debug, Clone)]
struct Parts {
    connect: bool,
    host: String,
    port: u16,
    path: String,
    headers: Vec<(String, String)>,
}

fn parts() -> impl Strategy<Value = Parts> {
    (
        any::<bool>(),
        prop_oneof![
            "[a-z][a-z0-9-]{0,8}(\\.[a-z][a-z0-9-]{0,8}){0,3}",
            Just("10.77.0.10".to_string()),
        ],
        1u16..,
        "(/[a-zA-Z0-9._~-]{0,6}){1,4}(\\?[a-z]=[a-z0-9]{0,4})?",
        prop::collection::vec(("[A-Za-z][A-Za-z0-9-]{0,10}", "[ -~]{0,20}"), 0..8),
    )
        .prop_map(|(connect, host, port, path, headers)| Parts {
            connect,
            host,
            port,
            path,
            headers: headers
                .into_iter()
                .filter(|(n, _)| {
                    !n.eq_ignore_ascii_case("content-length")
                        && !n.eq_ignore_ascii_case("transfer-encoding")
                })
                .map(|(n, v)| (n, v.trim().to_string()))
                .collect(),
        })
}

fn render(p: &Parts) -> String {
    let mut s = if p.connect {
        format!("CONNECT {}:{} HTTP/1.1\r\n", p.host, p.port)
    } else {
        format!("GET http://{}:{}{} HTTP/1.1\r\n", p.host, p.port, p.path)
    };
    for (n, v) in &p.headers {
        s.push_str(&format!("{n}: {v}\r\n"));
    }
    s.push_str("\r\n");
    s
}

#[test]
fn well_formed_heads_parse_to_their_parts() {
    support::fuzz::run(
        "egress_request/well_formed",
        support::fuzz::config(800),
        &parts(),
        |p| {
            let text = render(&p);
            let h = parse_head(text.as_bytes())
                .map_err(|e| TestCaseError::fail(format!("{e}: {text:?}")))?;
            prop_assert_eq!(head_end(text.as_bytes()), Some(Ok(text.len())));
            match h.target {
                Target::Connect(d) => {
                    prop_assert!(p.connect);
                    prop_assert_eq!((d.host, d.port), (p.host, p.port));
                }
                Target::Forward {
                    dest,
                    path_and_query,
                    ..
                } => {
                    prop_assert!(!p.connect);
                    prop_assert_eq!((dest.host, dest.port), (p.host, p.port));
                    prop_assert_eq!(path_and_query, p.path);
                }
            }
            prop_assert_eq!(h.headers, p.headers);
            Ok(())
        },
    );
}

#[test]
fn one_defect_is_always_refused() {
    let defects = prop::sample::select(vec![
        "\n", "\r", "\0", "\x01", "\x7f", " fold", "cl-te", "cl-cl", "te", "fragment", "big",
    ]);
    support::fuzz::run(
        "egress_request/one_defect",
        support::fuzz::config(800),
        &(parts(), defects, any::<prop::sample::Index>()),
        |(p, d, at)| {
            let mut text = render(&p);
            let line_end = text.find("\r\n").unwrap();
            match d {
                "\n" | "\r" | "\0" | "\x01" | "\x7f" => {
                    // Somewhere inside the head, before its blank line.
                    let i = 1 + at.index(text.len() - 5);
                    text.insert_str(i, d);
                }
                " fold" => text.insert_str(line_end + 2, "X-A: a\r\n folded\r\n"),
                "cl-te" => text.insert_str(
                    line_end + 2,
                    "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n",
                ),
                "cl-cl" => {
                    text.insert_str(line_end + 2, "Content-Length: 1\r\nContent-Length: 2\r\n")
                }
                "te" => text.insert_str(line_end + 2, "Transfer-Encoding: gzip\r\n"),
                "fragment" if !p.connect => text.insert_str(line_end - 9, "#frag"),
                "fragment" => text.insert_str(line_end - 9, "/x"),
                _ => text.insert_str(
                    line_end + 2,
                    &format!("X-Pad: {}\r\n", "a".repeat(MAX_HEAD)),
                ),
            }
            let r = parse_head(text.as_bytes());
            prop_assert!(r.is_err(), "{d:?} accepted: {text:?} -> {r:?}");
            if d == "big" {
                prop_assert_eq!(r.unwrap_err(), HeadError::TooLarge);
            }
            Ok(())
        },
    );
}
