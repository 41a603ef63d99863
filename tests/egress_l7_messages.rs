//! L7 inspection beyond single requests: `protocol: websocket` (the upgrade, each text message
//! checked, closes with 1008 and 1012) and `request_body_credential_rewrite`, in the world of
//! `support::egress::l7` (the sandbox namespace, the interceptor, the hyper upstreams).

// The upstream's test CA is trusted through a knob compiled into test builds only.
#![cfg(feature = "test-pause-points")]

mod support;

use std::time::Duration;

use openshell_sandbox::egress::L7Decision;
use support::egress::l7::*;
use support::egress::tools::*;
use support::egress::*;

/// A WebSocket session through the proxy, raw (no library between the test and the wire):
/// CONNECT, the upgrade to PATH, then each text message in turn; prints the 101's status
/// line, each frame received as `text:<payload>` or `close:<code>`, and `eof`.
const WS_CLIENT: &str = r#"
import os, socket, struct, sys
path, msgs = sys.argv[1], sys.argv[2:]
s = socket.create_connection(("10.200.0.1", 3128))
s.sendall(b"CONNECT ws.test:8180 HTTP/1.1\r\nHost: ws.test:8180\r\n\r\n")
f = s.makefile("rb")
assert f.readline().startswith(b"HTTP/1.1 200"); f.readline()
s.sendall(("GET %s HTTP/1.1\r\nHost: ws.test:8180\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n" % path).encode())
print(f.readline().decode().strip(), flush=True)
while f.readline() not in (b"\r\n", b""): pass
def frame():
    h = f.read(2)
    if len(h) < 2: return None
    n = h[1] & 0x7f
    if n == 126: n = struct.unpack(">H", f.read(2))[0]
    p = f.read(n)
    if h[0] & 0x0f == 8: return "close:%d" % struct.unpack(">H", p[:2])[0]
    return "text:" + p.decode()
for m in msgs:
    if m == "WAIT":
        print("open", flush=True)
    else:
        key = os.urandom(4)
        data = bytes(b ^ key[i % 4] for i, b in enumerate(m.encode()))
        s.sendall(bytes([0x81, 0x80 | len(data)]) + key + data)
    got = frame()
    print(got or "eof", flush=True)
    if got is None or got.startswith("close"): break
else:
    # Done: close as a client does, and see the close answered.
    key = os.urandom(4)
    s.sendall(bytes([0x88, 0x82]) + key + bytes(b ^ key[i] for i, b in enumerate(b"\x03\xe8")))
    print(frame() or "eof", flush=True)
print("eof" if f.read(1) == b"" else "more", flush=True)
"#;

#[test]
fn websocket_upgrades_and_text_messages_follow_the_rules() {
    let Some(curl) = curl_or_skip() else { return };
    let Some(py) = need("python3", python()) else {
        return;
    };
    World::run(move |w| {
        let l = start(w, &curl);
        let ws = |path: &str, msgs: &[&str]| {
            let mut c = w.in_sandbox(&py);
            c.args(["-c", WS_CLIENT, path]).args(msgs);
            output(c, Duration::from_secs(60))
        };
        let out = ws("/rt/chat?room=1", &["hi", "again"]);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                "HTTP/1.1 101 Switching Protocols",
                "text:echo:hi",
                "text:echo:again",
                "close:1000",
                "eof"
            ],
            "{out}"
        );
        // No compression was negotiated: the relay reads every text message.
        let heads = l.up.heads();
        assert!(
            !heads.last().unwrap().contains("sec-websocket-extensions"),
            "{heads:?}"
        );
        // A message the deny rules refuse: 1008 to the client, nothing upstream but the close.
        let out = ws("/rt/admin/x", &["drop tables"]);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            ["HTTP/1.1 101 Switching Protocols", "close:1008", "eof"],
            "{out}"
        );
        assert_eq!(l.up.ws_messages.lock().unwrap().clone(), ["hi", "again"]);
        wait_until("the upstream's close", Duration::from_secs(10), || {
            l.up.ws_closes.lock().unwrap().contains(&1008)
        });
        let events = w.events.1.lock().unwrap().clone();
        assert!(events.iter().any(|e| e.decision == L7Decision::Deny
            && e.message() == "L7_REQUEST deny WEBSOCKET_TEXT ws.test:8180/rt/admin/x reason=WEBSOCKET_TEXT /rt/admin/x blocked by deny rule"), "{events:?}");
        // An upgrade outside the rules, and a plain request to a websocket endpoint: 403.
        let mut c = w.in_sandbox(&py);
        c.args(["-c", WS_CLIENT, "/other"]);
        assert_eq!(
            output(c, Duration::from_secs(30)).lines().next(),
            Some("HTTP/1.1 403 Forbidden")
        );
        let (out, _) = l.curl(w, &["-p", "http://ws.test:8180/rt/plain"]);
        let (line, head, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{out}");
        assert_eq!(header(&head, "x-openshell-policy"), Some("realtime"));
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            j["detail"],
            "websocket endpoint requires a valid WebSocket upgrade request"
        );
        assert_eq!(j["protocol"], "websocket");
        // A new revision closes an open session with 1012.
        let mut c = w.in_sandbox(&py);
        c.args(["-c", WS_CLIENT, "/rt/live", "one", "WAIT"]);
        c.stdout(std::process::Stdio::piped());
        let child = c.spawn().unwrap();
        wait_until(
            "the session's first message",
            Duration::from_secs(20),
            || {
                l.up.ws_messages
                    .lock()
                    .unwrap()
                    .contains(&"one".to_string())
            },
        );
        std::thread::sleep(Duration::from_millis(300));
        let rules = w.rules("  other:\n    endpoints: [{host: x.test, port: 1}]\n    binaries: [{path: /t/bin/probe-a}]\n");
        w.policy().publish(rules);
        let out = String::from_utf8_lossy(&child.wait_with_output().unwrap().stdout).into_owned();
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                "HTTP/1.1 101 Switching Protocols",
                "text:echo:one",
                "open",
                "close:1012",
                "eof"
            ],
            "{out}"
        );
    });
}

#[test]
fn request_bodies_are_rewritten_where_the_endpoint_asks() {
    let Some(curl) = curl_or_skip() else { return };
    World::run(move |w| {
        let l = start(w, &curl);
        let p = "openshell:resolve:env:GITHUB_TOKEN";
        let json = format!("{{\"token\":\"{p}\",\"n\":1}}");
        let (out, code) = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/json",
                "--data",
                &json,
                "https://body.test:9443/rw",
            ],
        );
        assert_eq!(code, 0, "{out}");
        let j: serde_json::Value = serde_json::from_str(&last_response(&out).2).unwrap();
        let want = format!("{{\"token\":\"{SECRET}\",\"n\":1}}");
        // The echo comes back with the value replaced by its placeholder again (the response
        // is redacted); the upstream's Content-Length shows it got the value.
        assert_eq!(j["body"], json.as_str(), "the echo is redacted");
        let heads = l.up.heads();
        assert!(
            heads[0].contains(&format!("content-length: {}", want.len())),
            "{heads:?}"
        );
        assert!(!heads.concat().contains("openshell:resolve"));
        // A chunked form body too.
        let (out, _) = l.curl(
            w,
            &[
                "-H",
                "Transfer-Encoding: chunked",
                "--data",
                &format!("t={p}"),
                "https://body.test:9443/form",
            ],
        );
        let j: serde_json::Value = serde_json::from_str(&last_response(&out).2).unwrap();
        assert_eq!(j["body"], format!("t={p}").as_str(), "{out}");
        let heads = l.up.heads();
        let form = format!("content-length: {}", format!("t={SECRET}").len());
        assert!(heads.last().unwrap().contains(&form), "{heads:?}");
        // Not a textual type: never rewritten, and the placeholder never reaches the upstream.
        let before = l.up.requests().len();
        let _ = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/octet-stream",
                "--data",
                &format!("x{p}"),
                "https://body.test:9443/bin",
            ],
        );
        assert!(!l.up.heads().concat().contains("openshell:resolve"));
        assert!(l.up.requests().len() <= before + 1);
        // Too big to buffer: 413, nothing sent.
        let big = w.tmp.path().join("big.json");
        std::fs::write(&big, format!("\"{p}{}\"", "a".repeat(300 * 1024))).unwrap();
        let before = l.up.requests().len();
        let (out, _) = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                &format!("@{}", big.display()),
                "https://body.test:9443/big",
            ],
        );
        let (line, _, body) = last_response(&out);
        assert_eq!(line, "HTTP/1.1 413 Payload Too Large", "{out:.300}");
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["error"], "request_body_too_large");
        assert_eq!(l.up.requests().len(), before);
        // Where the endpoint does not ask (cred.test), a JSON body keeps failing closed.
        let _ = l.curl(
            w,
            &[
                "-H",
                "Content-Type: application/json",
                "--data",
                &json,
                "https://cred.test:9443/quiet/nobody",
            ],
        );
        assert!(!l.up.heads().concat().contains("openshell:resolve"));
    });
}

/// A client still sending a body the proxy refused early: head and the first 16 KiB of a
/// body declared too big to rewrite, a pause (the 413 is answered meanwhile), then the rest.
/// Prints how the rest went (`sent`, or the error) and the status line read afterwards.
const LATE_BODY: &str = r#"
import socket, ssl, time
s = socket.create_connection(("10.200.0.1", 3128))
s.sendall(b"CONNECT body.test:9443 HTTP/1.1\r\nHost: body.test:9443\r\n\r\n")
assert s.recv(4096).startswith(b"HTTP/1.1 200")
t = ssl.create_default_context().wrap_socket(s, server_hostname="body.test")
body = b'"' + b"a" * (300 * 1024) + b'"'
t.sendall(b"POST /big HTTP/1.1\r\nHost: body.test:9443\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body[:16384])
time.sleep(0.5)
try:
    t.sendall(body[16384:])
    sent = "sent"
except OSError as e:
    sent = "send-failed:%s" % type(e).__name__
got = b""
try:
    while True:
        b = t.recv(65536)
        if not b: break
        got += b
except OSError as e:
    got += b"\nread-failed:" + type(e).__name__.encode()
print(sent, got.split(b"\r\n")[0].decode(), flush=True)
"#;

/// The proxy answers before the body is read (a declared length over the rewrite buffer); it
/// must not close with the rest of the body unread, which makes the kernel send a reset that
/// a client still sending sees instead of the 413.
#[test]
fn a_body_refused_before_it_is_read_gets_its_413_not_a_reset() {
    let Some(curl) = curl_or_skip() else { return };
    let Some(py) = need("python3", python()) else {
        return;
    };
    World::run(move |w| {
        let l = start(w, &curl);
        let mut c = l.cmd(w, &py);
        c.args(["-c", LATE_BODY]);
        let out = output(c, Duration::from_secs(60));
        assert_eq!(out.trim(), "sent HTTP/1.1 413 Payload Too Large", "{out}");
    });
}
