//! The strict head parser.

use super::request::*;
use super::response;

fn parse(s: &str) -> Result<Head, HeadError> {
    parse_head(s.as_bytes())
}

#[test]
fn connect_targets() {
    let h = parse("CONNECT PUB.test:8080 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let Target::Connect(d) = &h.target else {
        panic!()
    };
    assert_eq!((d.host.as_str(), d.port), ("PUB.test", 8080));
    assert_eq!(d.policy_host(), "pub.test");
    assert_eq!(d.display(), "pub.test:8080");
    let h = parse("CONNECT [2001:db8::1]:443 HTTP/1.0\r\n\r\n").unwrap();
    let Target::Connect(d) = &h.target else {
        panic!()
    };
    assert_eq!(d.host, "2001:db8::1");
    assert_eq!(d.display(), "[2001:db8::1]:443");
    for bad in [
        "pub.test",
        "pub.test:",
        "pub.test:0",
        "pub.test:65536",
        "pub.test:+80",
        "[::1:443",
        "[nothost]:443",
        "::1:443",
        "a..b:80",
        "a b:80",
        "http://pub.test:80",
        ":80",
    ] {
        let e = parse(&format!("CONNECT {bad} HTTP/1.1\r\n\r\n")).unwrap_err();
        assert!(
            matches!(e, HeadError::ConnectTarget(_) | HeadError::Malformed(_)),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn forward_targets() {
    let h = parse("GET http://Pub.Test:8080/x?q=1 HTTP/1.1\r\nHost: evil.test\r\n\r\n").unwrap();
    let Target::Forward {
        dest,
        authority,
        path_and_query,
    } = &h.target
    else {
        panic!()
    };
    assert_eq!((dest.host.as_str(), dest.port), ("Pub.Test", 8080));
    assert_eq!(authority, "Pub.Test:8080");
    assert_eq!(path_and_query, "/x?q=1");
    let h = parse("GET http://pub.test HTTP/1.1\r\n\r\n").unwrap();
    let Target::Forward {
        dest,
        path_and_query,
        ..
    } = &h.target
    else {
        panic!()
    };
    assert_eq!((dest.port, path_and_query.as_str()), (80, "/"));
    assert_eq!(
        parse("GET https://pub.test/ HTTP/1.1\r\n\r\n").unwrap_err(),
        HeadError::HttpsUrl
    );
    assert!(
        matches!(parse("GET ftp://pub.test/ HTTP/1.1\r\n\r\n").unwrap_err(), HeadError::Scheme(s) if s == "ftp")
    );
    for bad in [
        "GET / HTTP/1.1",
        "GET * HTTP/1.1",
        "GET http:///x HTTP/1.1",
        "GET http://pub.test/x#frag HTTP/1.1",
        "GET http://u:p@pub.test/ HTTP/1.1",
        "GET http://pub.test:99999/ HTTP/1.1",
        "GET http://pub.test:/ HTTP/1.1",
    ] {
        assert!(
            matches!(
                parse(&format!("{bad}\r\n\r\n")),
                Err(HeadError::Malformed(_))
            ),
            "{bad}"
        );
    }
}

#[test]
fn header_hygiene() {
    for bad in [
        "CONNECT a.test:80  HTTP/1.1\r\n\r\n",
        "CONNECT a.test:80 HTTP/2.0\r\n\r\n",
        "connect a.test:80 HTTP/1.1\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nX : a\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nX: a\nY: b\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nX: a\x01b\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nX: a\rb\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        "CONNECT a.test:80 HTTP/1.1\r\nBad\u{0}Name: x\r\n\r\n",
    ] {
        assert!(parse(bad).is_err(), "{bad:?} accepted");
    }
    // `connect` is not CONNECT: it is a method to forward, and its target is no URI.
    assert!(
        parse("POST http://a.test/ HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n")
            .is_ok()
    );
    assert!(
        parse_head(b"CONNECT a.test:80 HTTP/1.1\r\nX: \xff\r\n\r\n").is_err(),
        "not UTF-8"
    );
}

#[test]
fn head_end_and_size() {
    assert_eq!(
        head_end(b"GET http://a/ HTTP/1.1\r\n\r\nbody"),
        Some(Ok(26))
    );
    assert_eq!(head_end(b"GET http://a/ HTTP/1.1\r\n"), None);
    assert!(matches!(
        head_end(b"GET http://a/ HTTP/1.1\n\n"),
        Some(Err(_))
    ));
    let big = format!(
        "CONNECT a.test:80 HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(MAX_HEAD)
    );
    assert_eq!(parse(&big).unwrap_err(), HeadError::TooLarge);
    let many: String = (0..200).map(|i| format!("H{i}: v\r\n")).collect();
    assert_eq!(
        parse(&format!("CONNECT a.test:80 HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
        HeadError::TooLarge
    );
}

#[test]
fn responses() {
    let r = String::from_utf8(response::policy_denied(
        "CONNECT a:1 not permitted by policy",
        "why",
    ))
    .unwrap();
    assert!(
        r.starts_with("HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"),
        "{r}"
    );
    assert!(r.contains("\r\nConnection: close\r\n\r\n"));
    let body: serde_json::Value =
        serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"error": "policy_denied", "detail": "CONNECT a:1 not permitted by policy", "reason": "why"})
    );
    let r = String::from_utf8(response::for_head_error(&HeadError::TooLarge)).unwrap();
    assert_eq!(
        r,
        "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let r = String::from_utf8(response::for_head_error(&HeadError::HttpsUrl)).unwrap();
    assert!(r.ends_with("\r\n\r\nUse CONNECT for HTTPS URLs"), "{r}");
}
