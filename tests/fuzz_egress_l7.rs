//! Fuzzing what the L7 relay does to a request before it goes upstream: the path
//! canonicaliser (`egress::l7::path`) and the credential rewriter (`egress::credentials`).
//!
//! - any target: `canonicalize` never panics; what it accepts is canonical (starts with `/`,
//!   no empty, `.` or `..` segment, no `;`, no control or non-ASCII byte, no lower-case or
//!   unreserved escape, at most 4 KiB) and canonicalising it again changes nothing, so the
//!   rules and the upstream can only ever read one path;
//! - any header value: the rewriter never panics; when it succeeds no placeholder is left and
//!   no value goes to an endpoint it is not bound to; a value without the marker is untouched.
//!
//! Bounded by case count, or by `OSB_FUZZ_SECONDS` (see tests/fuzz_support). Seeds:
//! fuzz/corpus/egress_l7_path (`ok-*` must canonicalise, `bad-*` must not).

mod support;

use openshell_sandbox::egress::credentials::{Binding, CredentialError, Credentials, MARKER};
use openshell_sandbox::egress::l7::path::{MAX_PATH, canonicalize};
use proptest::prelude::*;

fn check_path(input: &str, slash: bool) -> Result<(), TestCaseError> {
    let Ok(c) = canonicalize(input, slash) else {
        return Ok(());
    };
    let p = &c.path;
    prop_assert!(p.starts_with('/'), "{p:?}");
    prop_assert!(p.len() <= MAX_PATH);
    prop_assert!(
        !p.contains(';') && !p.contains('?') && !p.contains('#'),
        "{p:?}"
    );
    prop_assert!(p.bytes().all(|b| (0x21..0x7f).contains(&b)), "{p:?}");
    let inner = p.trim_start_matches('/').trim_end_matches('/');
    if !inner.is_empty() {
        for seg in inner.split('/') {
            prop_assert!(
                !seg.is_empty() && seg != "." && seg != "..",
                "{p:?} from {input:?}"
            );
        }
    }
    let b = p.as_bytes();
    for (i, _) in p.match_indices('%') {
        let hh = &b[i + 1..i + 3];
        prop_assert!(
            hh.iter()
                .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c)),
            "{p:?}"
        );
        let v = u8::from_str_radix(std::str::from_utf8(hh).unwrap(), 16).unwrap();
        prop_assert!(
            !(v.is_ascii_alphanumeric() || b"-._~".contains(&v)),
            "{p:?}"
        );
        prop_assert!(slash || v != b'/', "{p:?}");
    }
    let again = canonicalize(&c.target(), slash);
    prop_assert_eq!(again.as_ref(), Ok(&c), "not idempotent for {:?}", input);
    Ok(())
}

#[test]
fn seeds() {
    for (name, bytes) in support::fuzz::corpus("egress_l7_path") {
        let s = String::from_utf8(bytes).unwrap();
        let r = canonicalize(&s, false);
        if name.starts_with("ok-") {
            assert!(r.is_ok(), "{name}: {r:?}");
        } else {
            assert!(r.is_err(), "{name}: accepted {r:?}");
        }
        check_path(&s, false).unwrap();
    }
}

#[test]
fn any_target() {
    let seg = prop::sample::select(vec![
        "a", "b", ".", "..", "", ";p", "..;x", "%2e", "%2E%2e", "%2F", "%2f", "%41", "%7e", "%3B",
        "%00", "%0a", "%", "%4", "%zz", "%C3%A9", "~", "?", "#", "*", "\u{e9}", "\x7f", "a;b=c",
    ]);
    let target = prop_oneof![
        prop::collection::vec(seg, 0..12).prop_map(|v| format!("/{}", v.join("/"))),
        "[ -~]{0,80}",
        any::<String>(),
    ];
    support::fuzz::run(
        "egress_l7/any_target",
        support::fuzz::config(3000),
        &(target, any::<bool>()),
        |(t, slash)| check_path(&t, slash),
    );
}

fn store() -> Credentials {
    let mut c = Credentials::new(2, &"a1".repeat(32));
    for (k, v) in [("TOKEN", "real-token"), ("K_2", "v2:with:colons")] {
        c.insert(k, v.to_string(), vec![Binding::new("bound.test", 443)]);
    }
    c
}

#[test]
fn any_header_value() {
    let piece = prop::sample::select(vec![
        MARKER.to_string(),
        format!("{MARKER}TOKEN"),
        format!("{MARKER}K_2"),
        format!("{MARKER}v2_TOKEN"),
        format!("{MARKER}v3_TOKEN"),
        format!("{MARKER}s{}_TOKEN", "a1".repeat(32)),
        format!("{MARKER}NOPE"),
        "Bearer ".to_string(),
        "Basic ".to_string(),
        "b3BlbnNoZWxsOnJlc29sdmU6ZW52OlRPS0VO".to_string(),
        "x".to_string(),
        ":".to_string(),
        " ".to_string(),
        "openshell:".to_string(),
    ]);
    let value = prop::collection::vec(piece, 0..6).prop_map(|v| v.concat());
    let store = store();
    support::fuzz::run(
        "egress_l7/any_header_value",
        support::fuzz::config(3000),
        &(value, any::<bool>()),
        |(v, bound)| {
            let host = if bound { "bound.test" } else { "other.test" };
            match store.rewrite_header(&v, host, 443) {
                Ok(None) => {
                    prop_assert!(!v.contains(MARKER), "{v:?}");
                }
                Ok(Some(out)) => {
                    prop_assert!(bound, "a value went to an unbound endpoint: {v:?}");
                    prop_assert!(!out.contains(MARKER), "{v:?} -> {out:?}");
                }
                Err(CredentialError::NotBound { .. }) => prop_assert!(!bound),
                Err(CredentialError::Unresolvable(_)) => {}
            }
            Ok(())
        },
    );
}
