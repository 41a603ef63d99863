//! A hostile sandbox against the credential relay, through the real binary: it tries to get a
//! credential's real value back (an upstream that reflects what it got), to send it to
//! another origin behind the same front end (a second `Host`), to have it sent in clear text
//! (plain HTTP inside a CONNECT to a TLS port), and to push placeholders out where they are
//! neither replaced nor refused (percent-encoded in the target, chunked trailers, WebSocket
//! text). Each attack asserts what the client got and what the upstream received.
//!
//! The world is the egress tests' own (tests/support/egress: the supervisor in a test-made
//! namespace, upstream addresses on its `lo`, no route anywhere). Besides the L7 upstreams of
//! `support::egress::l7_servers`, this file runs a reflecting plain-HTTP upstream of its own
//! on 8181 and 443 that sends back, in its headers and a body cut into 7-byte chunks, all
//! that it received.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use support::egress::binary::finish;
use support::egress::l7_servers::L7Upstream;
use support::egress::*;
use support::skip::have;
use support::text;

const SECRET: &str = "rg-REAL-4b7e21c9d0";
const PLACEHOLDER: &str = "openshell:resolve:env:RG_TOKEN";

/// Everything the reflecting upstream received: per request, its line, headers, body and
/// trailers, as text.
#[derive(Default)]
struct Reflector {
    seen: Mutex<Vec<String>>,
}

type RBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn reflect(req: Request<Incoming>, r: Arc<Reflector>) -> Result<Response<RBody>, Infallible> {
    let mut all = format!("{} {} {:?}\n", req.method(), req.uri(), req.version());
    for (k, v) in req.headers() {
        all.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
    }
    let origin = req.headers().get("origin").cloned();
    let auth = req.headers().get("authorization").cloned();
    let gz = req.uri().path() == "/gz";
    let mut body = req.into_body();
    while let Some(Ok(f)) = body.frame().await {
        match f.into_data() {
            Ok(d) => all.push_str(&String::from_utf8_lossy(&d)),
            Err(f) => {
                if let Ok(t) = f.into_trailers() {
                    for (k, v) in &t {
                        all.push_str(&format!("\ntrailer {k}: {}", text(v.as_bytes())));
                    }
                }
            }
        }
    }
    r.seen.lock().unwrap().push(all.clone());
    // The body in 7-byte chunks, a pause between each: a value is cut across frames.
    let chunks: Vec<Bytes> = all
        .into_bytes()
        .chunks(7)
        .map(Bytes::copy_from_slice)
        .collect();
    let stream = futures::StreamExt::then(futures::stream::iter(chunks), |c| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok::<_, Infallible>(Frame::data(c))
    });
    let mut resp = Response::builder().header("content-type", "text/plain");
    if let Some(o) = origin {
        resp = resp.header("access-control-allow-origin", o);
    }
    if let Some(a) = auth {
        resp = resp.header("x-echo-auth", a);
    }
    if gz {
        resp = resp.header("content-encoding", "gzip");
    }
    Ok(resp.body(BodyExt::boxed(StreamBody::new(stream))).unwrap())
}

fn start_reflector(w: &World, ports: &[u16]) -> Arc<Reflector> {
    let r = Arc::new(Reflector::default());
    for &port in ports {
        let r = r.clone();
        let l =
            w.rt.block_on(tokio::net::TcpListener::bind(SocketAddr::new(
                PUBLIC.into(),
                port,
            )))
            .unwrap();
        w.rt.spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |q| reflect(q, r.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
    }
    r
}

/// A client in the sandbox that writes exactly the bytes it is given: CONNECT through the
/// proxy of `HTTPS_PROXY`, then TLS (verified with the sandbox's bundle) or not, then the
/// raw request (`\r\n` escapes allowed) or a WebSocket session sending one text message.
const CLIENT: &str = r#"
import os, socket, ssl, sys, urllib.parse, base64
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=8)
s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    if not c: break
    head += c
if b" 200" not in head.split(b"\r\n")[0]:
    rest = s.recv(65536)
    sys.stdout.write((head + rest).decode("latin1")); sys.exit(0)
if mode in ("tls", "ws"):
    ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    s = ctx.wrap_socket(s, server_hostname=host)
def drain():
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d: break
            out += d
    except Exception:
        pass
    return out
if mode == "ws":
    s.sendall((f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c: break
        head += c
    print(head.split(b"\r\n")[0].decode())
    msg = sys.argv[4].encode()
    key = b"\x01\x02\x03\x04"
    s.sendall(bytes([0x81, 0x80 | len(msg)]) + key + bytes(b ^ key[i % 4] for i, b in enumerate(msg)))
    out = drain()
    if len(out) >= 4 and out[0] & 0x0f == 8:
        print("close", int.from_bytes(out[2:4], "big"))
    else:
        print("frames", out)
    sys.exit(0)
req = sys.argv[4].encode().decode("unicode_escape").encode("latin1")
s.sendall(req)
sys.stdout.write(drain().decode("latin1"))
"#;

struct Attack {
    up: Arc<L7Upstream>,
    reflector: Arc<Reflector>,
    work: PathBuf,
    binds: Vec<(PathBuf, PathBuf)>,
}

const FS: &str = "\
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc]
  read_write: [/tmp]
";

fn setup(w: &mut World, endpoints: &str) -> Attack {
    let up = w.rt.block_on(L7Upstream::start());
    let reflector = start_reflector(w, &[8181, 443]);
    let work = w.tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(work.join("client.py"), CLIENT).unwrap();
    let policy = format!(
        "{FS}network_policies:
  creds:
    endpoints:
{endpoints}
    binaries: [{{path: /usr/bin/curl}}, {{path: \"/usr/bin/python3*\"}}]
"
    );
    std::fs::write(work.join("policy.yaml"), policy).unwrap();
    let bundle = bundle_with(w.tmp.path(), &up.ca_pem);
    let binds = vec![
        (w.hosts.clone(), PathBuf::from("/etc/hosts")),
        (bundle, PathBuf::from(SYSTEM_BUNDLE)),
    ];
    Attack {
        up,
        reflector,
        work,
        binds,
    }
}

impl Attack {
    /// `script` under `run --credential RG_TOKEN@<binding>`; what the child printed, and the
    /// whole output (checked for the value: the child's stdout, our log).
    fn run(&self, binding: &str, script: &str) -> (String, Output) {
        let mut c = osb_in(&self.binds, &self.work);
        c.args(["run", "--log-level", "warn,egress=info"])
            .args(["--policy", "policy.yaml", "--credential", binding])
            .args(["--", "sh", "-c", script])
            .env("RG_TOKEN", SECRET);
        let out = finish(c, Duration::from_secs(180));
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(
            !stdout.contains(SECRET),
            "the real value reached the sandbox:\n{stdout}"
        );
        assert!(!text(&out.stderr).contains(SECRET), "{out:?}");
        (stdout, out)
    }

    /// Everything either upstream received.
    fn received(&self) -> String {
        let mut all = self.up.requests().join("\n");
        all.push('\n');
        all.push_str(&self.up.heads().join("\n"));
        all.push('\n');
        all.push_str(&self.up.ws_messages.lock().unwrap().join("\n"));
        all.push('\n');
        all.push_str(&self.reflector.seen.lock().unwrap().join("\n"));
        all
    }
}

/// The JSON error body of the one response in `part`, and its status line.
fn refusal(part: &str) -> (String, serde_json::Value) {
    let at = part
        .rfind("HTTP/1.1 ")
        .unwrap_or_else(|| panic!("no response in {part:?}"));
    let (line, _, body) = split_response(&part[at..]);
    let j = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {part:?}"));
    (line, j)
}

#[test]
fn a_second_host_header_is_refused_before_a_credential_goes_out() {
    if !require() || !have("python3") {
        return;
    }
    World::run(|w| {
        let a = setup(w, "      - {host: cred.test, port: 9443}");
        // Two Host fields: the first names the tunnel's authority, the second another origin
        // behind the same front end. Both would reach the upstream, the credential with them.
        let script = r#"
python3 client.py tls cred.test 9443 "GET /two HTTP/1.1\r\nHost: cred.test:9443\r\nHost: other.example:9443\r\nAuthorization: Bearer $RG_TOKEN\r\nConnection: close\r\n\r\n"
echo ---
python3 client.py tls cred.test 9443 "GET /one HTTP/1.1\r\nHost: cred.test:9443\r\nX-A: $RG_TOKEN\r\nConnection: close\r\n\r\n" | head -1
"#;
        let (stdout, _) = a.run("RG_TOKEN@cred.test:9443", script);
        let parts: Vec<&str> = stdout.split("---\n").collect();
        let (line, j) = refusal(parts[0]);
        assert_eq!(line, "HTTP/1.1 400 Bad Request", "{stdout}");
        assert_eq!(j["error"], "invalid_host_header", "{j}");
        assert_eq!(
            j["detail"],
            "a request must carry exactly one Host header (it carried 2)"
        );
        // One Host: the request goes, with its value.
        assert_eq!(parts[1].trim(), "HTTP/1.1 200 OK", "{stdout}");
        assert_eq!(a.up.requests(), ["GET /one HTTP/1.1"], "{stdout}");
        assert!(!a.received().contains("other.example"));
    });
}

#[test]
fn an_upstream_that_reflects_the_credential_gives_back_only_its_placeholder() {
    if !require() || !have("curl") || !have("python3") {
        return;
    }
    World::run(|w| {
        let a = setup(
            w,
            "      - {host: cred.test, port: 9443, credential_binding: {provider: RG_TOKEN}}
      - {host: cred.test, port: 8181, protocol: rest, access: full, request_body_credential_rewrite: true, credential_binding: {provider: RG_TOKEN}}",
        );
        // The TLS upstream answers JSON repeating the request line and headers; the plain one
        // repeats Origin (CORS) and Authorization in its headers and everything it got in a
        // body cut into 7-byte chunks. curl asks for compressed answers.
        let script = r#"
curl -sS --max-time 20 --compressed -H "Authorization: Bearer $RG_TOKEN" "https://cred.test:9443/echo/$RG_TOKEN?k=$RG_TOKEN"; echo
echo ---
curl -sS --max-time 20 -p -x "$HTTPS_PROXY" -i -H "Authorization: Bearer $RG_TOKEN" -H "Origin: https://$RG_TOKEN.example" -H 'Content-Type: text/plain' --data "secret=$RG_TOKEN" http://cred.test:8181/post; echo
echo ---
curl -sS --max-time 20 -p -x "$HTTPS_PROXY" -i -u "me:$RG_TOKEN" http://cred.test:8181/basic; echo
echo ---
curl -sS --max-time 20 -p -x "$HTTPS_PROXY" -i -X TRACE -H "X-Token: $RG_TOKEN" http://cred.test:8181/trace; echo
echo ---
curl -sS --max-time 20 -p -x "$HTTPS_PROXY" -i -H "X-Token: $RG_TOKEN" http://cred.test:8181/gz; echo
echo ---
curl -sS --max-time 20 -p -x "$HTTPS_PROXY" -i -X TRACE http://cred.test:8181/plain-trace | head -1
"#;
        let (stdout, _) = a.run("RG_TOKEN", script);
        let parts: Vec<&str> = stdout.split("---\n").collect();
        assert_eq!(parts.len(), 6, "{stdout}");
        // The JSON echo: every repetition of the value is its placeholder again.
        let j: serde_json::Value =
            serde_json::from_str(parts[0].trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(
            j["request"],
            format!("GET /echo/{PLACEHOLDER}?k={PLACEHOLDER} HTTP/1.1")
        );
        let headers = j["headers"].to_string();
        assert!(
            headers.contains(&format!("Bearer {PLACEHOLDER}")),
            "{headers}"
        );
        // No Accept-Encoding went out with the injected request.
        assert!(!headers.contains("accept-encoding"), "{headers}");
        // Headers and a body cut across chunks.
        let p = parts[1];
        assert!(p.starts_with("HTTP/1.1 200"), "{stdout}");
        assert!(
            p.contains(&format!(
                "access-control-allow-origin: https://{PLACEHOLDER}.example"
            )),
            "{p}"
        );
        assert!(
            p.contains(&format!("x-echo-auth: Bearer {PLACEHOLDER}")),
            "{p}"
        );
        assert!(p.contains(&format!("secret={PLACEHOLDER}")), "{p}");
        // Basic: the value is inside base64; the encoded form comes back as the client's.
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert!(
            parts[2].contains(&format!(
                "authorization: Basic {}",
                b64(&format!("me:{PLACEHOLDER}"))
            )),
            "{}",
            parts[2]
        );
        assert!(!parts[2].contains(&b64(&format!("me:{SECRET}"))));
        // TRACE with a credential: refused before it leaves.
        let (line, j) = refusal(parts[3]);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{stdout}");
        assert_eq!(j["error"], "credential_reflection_refused", "{j}");
        // A compressed answer to an injected request cannot be searched: refused.
        let (line, j) = refusal(parts[4]);
        assert_eq!(line, "HTTP/1.1 502 Bad Gateway", "{stdout}");
        assert_eq!(j["error"], "credential_response_encoded", "{j}");
        // TRACE without a credential goes as before.
        assert!(parts[5].starts_with("HTTP/1.1 200"), "{stdout}");
        // The upstreams did get the value where it was bound (the redaction is on the way
        // back only), and never a TRACE carrying it.
        let got = a.received();
        assert!(got.contains(&format!("/echo/{SECRET}?k={SECRET}")), "{got}");
        assert!(got.contains(&format!("secret={SECRET}")), "{got}");
        assert!(!got.contains("/trace "), "{got}");
    });
}

#[test]
fn placeholders_that_would_leave_unreplaced_are_refused() {
    if !require() || !have("curl") || !have("python3") {
        return;
    }
    World::run(|w| {
        let a = setup(
            w,
            "      - {host: cred.test, port: 8181}
      - host: secure.test
        port: 9443
        protocol: websocket
        access: read-write",
        );
        let script = r#"
curl -sS --max-time 20 -p -x "$HTTPS_PROXY" -i "http://cred.test:8181/x/openshell%3Aresolve%3Aenv%3ARG_TOKEN"; echo
echo ---
curl -sS --max-time 20 -p -x "$HTTPS_PROXY" -i "http://cred.test:8181/x/openshell%3aresolve%3Aenv:RG_TOKEN"; echo
echo ---
python3 client.py plain cred.test 8181 "POST /trailer HTTP/1.1\r\nHost: cred.test:8181\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\nX-T: $RG_TOKEN\r\n\r\n"; echo
echo ---
python3 client.py ws secure.test 9443 "hello $RG_TOKEN"
"#;
        let (stdout, _) = a.run("RG_TOKEN@cred.test:8181", script);
        let parts: Vec<&str> = stdout.split("---\n").collect();
        assert_eq!(parts.len(), 4, "{stdout}");
        for p in &parts[..2] {
            let (line, j) = refusal(p);
            assert_eq!(line, "HTTP/1.1 400 Bad Request", "{stdout}");
            assert_eq!(j["error"], "invalid_credential_placeholder", "{j}");
        }
        // A trailer holding a placeholder: the request fails, the trailer never reaches the
        // upstream.
        assert!(!parts[2].contains("HTTP/1.1 200"), "{stdout}");
        // A WebSocket text message with a placeholder: closed with 1008 before it is sent.
        let ws: Vec<&str> = parts[3].lines().collect();
        assert_eq!(
            ws,
            ["HTTP/1.1 101 Switching Protocols", "close 1008"],
            "{stdout}"
        );
        let got = a.received();
        assert!(!got.to_ascii_lowercase().contains("resolve%3aenv"), "{got}");
        assert!(!got.contains("openshell:resolve"), "{got}");
        assert!(a.up.ws_messages.lock().unwrap().is_empty());
    });
}

#[test]
fn plain_http_inside_a_connect_to_a_tls_port_gets_no_credential() {
    if !require() || !have("python3") {
        return;
    }
    World::run(|w| {
        let a = setup(
            w,
            "      - {host: cred.test, port: 443}\n      - {host: cred.test, port: 8181}",
        );
        // The binding is for port 443, i.e. for TLS; the sandbox speaks plain HTTP inside the
        // CONNECT, so the value would cross the network in clear text.
        let script = r#"
python3 client.py plain cred.test 443 "GET /clear HTTP/1.1\r\nHost: cred.test:443\r\nX-A: $RG_TOKEN\r\nConnection: close\r\n\r\n"; echo
echo ---
python3 client.py plain cred.test 443 "GET /none HTTP/1.1\r\nHost: cred.test:443\r\nConnection: close\r\n\r\n" | head -1
"#;
        let (stdout, _) = a.run("RG_TOKEN@cred.test", script);
        let parts: Vec<&str> = stdout.split("---\n").collect();
        let (line, j) = refusal(parts[0]);
        assert_eq!(line, "HTTP/1.1 403 Forbidden", "{stdout}");
        assert_eq!(j["error"], "credential_requires_tls", "{j}");
        // Without a credential, plain HTTP there is not our business.
        assert_eq!(parts[1].trim(), "HTTP/1.1 200 OK", "{stdout}");
        let got = a.received();
        assert!(!got.contains("/clear"), "{got}");
        assert!(got.contains("GET /none"), "{got}");
    });
}

/// A client on a `request_body_credential_rewrite` endpoint that sends a body carrying a
/// placeholder, byte by byte, slower than the rewrite deadline allows.
const TRICKLE: &str = r#"
import os, socket, select, sys, time, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=8)
s.sendall(b"CONNECT cred.test:8181 HTTP/1.1\r\nHost: cred.test:8181\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert b" 200" in head.split(b"\r\n")[0], head
body = ("token=" + os.environ["RG_TOKEN"] + "&pad=").encode() + b"x" * 100
s.sendall(b"POST /slow HTTP/1.1\r\nHost: cred.test:8181\r\nContent-Type: text/plain\r\n"
          + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:20])
start, sent, out = time.monotonic(), 20, b""
# One byte every 2 s (the tunnel is never idle), until the proxy answers.
while time.monotonic() - start < 50 and sent < len(body):
    r, _, _ = select.select([s], [], [], 2)
    if r:
        break
    s.sendall(body[sent:sent + 1]); sent += 1
s.settimeout(20)
try:
    while True:
        d = s.recv(65536)
        if not d: break
        out += d
except Exception:
    pass
sys.stdout.write(out.decode("latin1"))
print("\nafter %d s, %d of %d bytes sent" % (time.monotonic() - start, sent, len(body)))
"#;

/// A body to rewrite that trickles in past the deadline: 408 `request_body_timeout` once the
/// deadline is over, and the upstream receives nothing of the request (neither its head nor a
/// part of the body rewritten so far).
#[test]
fn a_body_to_rewrite_that_trickles_past_the_deadline_gets_408_and_never_reaches_the_upstream() {
    if !require() || !have("python3") {
        return;
    }
    World::run(|w| {
        let a = setup(
            w,
            "      - {host: cred.test, port: 8181, protocol: rest, access: full, request_body_credential_rewrite: true}",
        );
        std::fs::write(a.work.join("trickle.py"), TRICKLE).unwrap();
        let (stdout, _) = a.run("RG_TOKEN@cred.test:8181", "python3 trickle.py");
        let (answer, after) = stdout
            .trim_end()
            .rsplit_once('\n')
            .unwrap_or_else(|| panic!("{stdout}"));
        let (line, j) = refusal(answer);
        assert_eq!(line, "HTTP/1.1 408 Request Timeout", "{stdout}");
        assert_eq!(j["error"], "request_body_timeout", "{j}");
        assert_eq!(
            j["detail"], "a body to rewrite must arrive whole within 30s",
            "{j}"
        );
        // The answer came at the deadline, while the body was still coming.
        let n: Vec<u64> = after.split(' ').filter_map(|w| w.parse().ok()).collect();
        let [secs, sent, len] = n[..] else {
            panic!("{stdout}")
        };
        assert!((29..=40).contains(&secs), "{stdout}");
        assert!(sent < len, "{stdout}");
        let got = a.received();
        assert!(!got.contains("/slow"), "{got}");
        assert!(!got.contains("token="), "{got}");
        assert!(!got.contains(SECRET), "{got}");
    });
}
