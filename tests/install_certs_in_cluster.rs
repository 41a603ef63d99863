//! `certs generate --in-cluster` against a small fake Kubernetes API server: TLS with a test
//! CA, bearer-token auth, and the Secret semantics the real one enforces (namespaces must
//! exist, names are unique, kubernetes.io/tls needs tls.crt and tls.key). Then the generated
//! set is used for a real mTLS handshake.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use support::{assert_fails_with, assert_ok, text};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_openshell-sandbox");
const TOKEN: &str = "test-token-for-the-hook-job";

#[derive(Default)]
struct State {
    namespaces: BTreeSet<String>,
    secrets: BTreeMap<(String, String), Value>,
    /// Namespaces where creating a Secret is forbidden (RBAC missing).
    forbid_create_in: BTreeSet<String>,
    log: Vec<String>,
}

type Shared = Arc<Mutex<State>>;

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "reason": reason, "message": message, "code": code.as_u16()});
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn ok_json(code: StatusCode, v: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

async fn handle(state: Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut st = state.lock().unwrap();
    st.log.push(format!("{method} {path}"));
    if auth.as_deref() != Some(&format!("Bearer {TOKEN}")) {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (ns, name) = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "secrets"] => (ns.to_string(), None),
        ["api", "v1", "namespaces", ns, "secrets", name] => {
            (ns.to_string(), Some(name.to_string()))
        }
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
    };
    if !st.namespaces.contains(&ns) {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("namespaces \"{ns}\" not found"),
        );
    }
    match (method, name) {
        (Method::GET, Some(name)) => match st.secrets.get(&(ns.clone(), name.clone())) {
            Some(v) => ok_json(StatusCode::OK, v),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("secrets \"{name}\" not found"),
            ),
        },
        (Method::DELETE, Some(name)) => match st.secrets.remove(&(ns, name.clone())) {
            Some(_) => ok_json(
                StatusCode::OK,
                &json!({"kind": "Status", "status": "Success"}),
            ),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("secrets \"{name}\" not found"),
            ),
        },
        (Method::POST, None) => {
            if st.forbid_create_in.contains(&ns) {
                return status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    &format!(
                        "secrets is forbidden: User \"system:serviceaccount:rt:certs\" cannot create resource \"secrets\" in API group \"\" in the namespace \"{ns}\""
                    ),
                );
            }
            let v: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(_) => return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON"),
            };
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if v["metadata"]["namespace"].as_str() != Some(ns.as_str()) || name.is_empty() {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "metadata does not match the path",
                );
            }
            let data = v["data"].as_object().cloned().unwrap_or_default();
            if data
                .values()
                .any(|d| d.as_str().and_then(|s| B64.decode(s).ok()).is_none())
            {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "data is not base64");
            }
            if v["type"] == "kubernetes.io/tls"
                && !(data.contains_key("tls.crt") && data.contains_key("tls.key"))
            {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "data[tls.crt]: Required value",
                );
            }
            let key = (ns, name.clone());
            if st.secrets.contains_key(&key) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("secrets \"{name}\" already exists"),
                );
            }
            st.secrets.insert(key, v.clone());
            ok_json(StatusCode::CREATED, &v)
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "not supported",
        ),
    }
}

struct FakeApi {
    addr: SocketAddr,
    state: Shared,
    dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

impl FakeApi {
    /// Serve on 127.0.0.1 with a certificate from a fresh test CA; write that CA and the
    /// token where the command will read them.
    fn start(namespaces: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();

        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));

        let state: Shared = Arc::new(Mutex::new(State {
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let st = state.clone();
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let st = st.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            dir,
            _rt: rt,
        }
    }

    fn generate(&self, extra: &[&str]) -> Output {
        self.generate_with_ca(&self.dir.path().join("ca.crt"), extra)
    }

    fn generate_with_ca(&self, ca: &Path, extra: &[&str]) -> Output {
        Command::new(BIN)
            .args(["certs", "generate", "--in-cluster", "--namespace", "rt"])
            .args(["--sandbox-namespace", "openshell"])
            .args(["--ssh-handshake-secret", "openshell-ssh-handshake"])
            .arg("--api-server")
            .arg(format!("https://{}", self.addr))
            .arg("--token-file")
            .arg(self.dir.path().join("token"))
            .arg("--ca-file")
            .arg(ca)
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap()
    }

    fn secret(&self, ns: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .secrets
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    fn data(&self, ns: &str, name: &str, key: &str) -> Vec<u8> {
        let s = self
            .secret(ns, name)
            .unwrap_or_else(|| panic!("no Secret {ns}/{name}"));
        B64.decode(s["data"][key].as_str().unwrap()).unwrap()
    }

    fn posts(&self) -> usize {
        self.state
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|l| l.starts_with("POST"))
            .count()
    }
}

/// A real mTLS handshake: server cert and client-CA from the release namespace, client cert
/// from the sandbox namespace, dialled by the Service's cluster DNS name.
fn mtls_handshake(api: &FakeApi) {
    let server_cert =
        CertificateDer::from_pem_slice(&api.data("rt", "openshell-server-tls", "tls.crt")).unwrap();
    let server_key =
        PrivateKeyDer::from_pem_slice(&api.data("rt", "openshell-server-tls", "tls.key")).unwrap();
    let client_ca =
        CertificateDer::from_pem_slice(&api.data("rt", "openshell-server-client-ca", "ca.crt"))
            .unwrap();
    let client_cert =
        CertificateDer::from_pem_slice(&api.data("openshell", "openshell-client-tls", "tls.crt"))
            .unwrap();
    let client_key =
        PrivateKeyDer::from_pem_slice(&api.data("openshell", "openshell-client-tls", "tls.key"))
            .unwrap();
    let trust =
        CertificateDer::from_pem_slice(&api.data("openshell", "openshell-client-tls", "ca.crt"))
            .unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client_roots = rustls::RootCertStore::empty();
    client_roots.add(client_ca).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(client_roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server_cert], server_key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trust).unwrap();
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![client_cert], client_key)
        .unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_cfg));
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.expect("server side of mTLS");
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await.unwrap();
            assert!(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .is_some_and(|c| !c.is_empty())
            );
            tls.write_all(&buf).await.unwrap();
            tls.shutdown().await.unwrap();
        });
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_cfg));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("openshell.rt.svc.cluster.local").unwrap();
        let mut tls = connector
            .connect(name, tcp)
            .await
            .expect("client side of mTLS");
        tls.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        tls.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        server.await.unwrap();
    });
}

#[test]
fn creates_the_whole_set_in_both_namespaces_then_keeps_it() {
    let api = FakeApi::start(&["rt", "openshell"]);
    let out = api.generate(&[]);
    assert_ok(&out);
    let stdout = text(&out.stdout);
    for s in [
        "rt/openshell-server-tls (kubernetes.io/tls)",
        "rt/openshell-client-tls (kubernetes.io/tls)",
        "openshell/openshell-client-tls (kubernetes.io/tls)",
        "rt/openshell-server-client-ca (Opaque)",
        "openshell/openshell-server-client-ca (Opaque)",
        "rt/openshell-ssh-handshake (Opaque)",
    ] {
        assert!(
            stdout.contains(&format!("created Secret {s}")),
            "{s} missing from: {stdout}"
        );
    }
    for (ns, name) in [
        ("rt", "openshell-server-tls"),
        ("rt", "openshell-client-tls"),
        ("openshell", "openshell-client-tls"),
    ] {
        let s = api.secret(ns, name).unwrap();
        assert_eq!(s["type"], "kubernetes.io/tls");
        assert_eq!(
            s["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "openshell-sandbox-certs"
        );
        let keys: Vec<&String> = s["data"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
    }
    // The same client identity in both namespaces, and the same CA everywhere.
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert_eq!(
            api.data("rt", "openshell-client-tls", key),
            api.data("openshell", "openshell-client-tls", key)
        );
    }
    let ca = api.data("rt", "openshell-server-client-ca", "ca.crt");
    assert_eq!(
        ca,
        api.data("openshell", "openshell-server-client-ca", "ca.crt")
    );
    assert_eq!(ca, api.data("rt", "openshell-server-tls", "ca.crt"));
    let hs = api.data("rt", "openshell-ssh-handshake", "secret");
    assert_eq!(hs.len(), 64);
    assert!(hs.iter().all(u8::is_ascii_hexdigit));
    mtls_handshake(&api);

    // Second run: everything kept byte for byte, nothing created.
    let before: Vec<Value> = api
        .state
        .lock()
        .unwrap()
        .secrets
        .values()
        .cloned()
        .collect();
    let posts = api.posts();
    let again = api.generate(&[]);
    assert_ok(&again);
    assert!(text(&again.stdout).contains("kept existing Secret openshell/openshell-client-tls"));
    assert!(text(&again.stdout).contains("kept existing Secret rt/openshell-ssh-handshake"));
    assert_eq!(api.posts(), posts, "a rerun must not create anything");
    let after: Vec<Value> = api
        .state
        .lock()
        .unwrap()
        .secrets
        .values()
        .cloned()
        .collect();
    assert_eq!(before, after);
}

#[test]
fn a_partial_set_fails_clearly_and_creates_nothing() {
    let api = FakeApi::start(&["rt", "openshell"]);
    api.state.lock().unwrap().secrets.insert(
        ("openshell".into(), "openshell-client-tls".into()),
        json!({"type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": "", "ca.crt": ""}}),
    );
    let out = api.generate(&[]);
    assert_fails_with(&out, "only some of the certificate set exists");
    let err = text(&out.stderr);
    assert!(
        err.contains(r#"present ["openshell/openshell-client-tls"]"#),
        "{err}"
    );
    assert!(err.contains("rt/openshell-server-tls"), "{err}");
    assert_eq!(api.posts(), 0);
}

#[test]
fn a_refused_create_rolls_back_what_this_run_made() {
    let api = FakeApi::start(&["rt", "openshell"]);
    api.state
        .lock()
        .unwrap()
        .forbid_create_in
        .insert("openshell".into());
    let out = api.generate(&[]);
    assert_fails_with(&out, "was refused with HTTP 403");
    assert!(text(&out.stderr).contains("cannot create resource"));
    assert!(api.posts() > 0, "it did try");
    assert!(
        api.state.lock().unwrap().secrets.is_empty(),
        "left behind: {:?}",
        api.state.lock().unwrap().secrets.keys().collect::<Vec<_>>()
    );
    // Once RBAC is fixed, a rerun starts clean.
    api.state.lock().unwrap().forbid_create_in.clear();
    assert_ok(&api.generate(&[]));
    assert!(
        api.secret("openshell", "openshell-server-client-ca")
            .is_some()
    );
}

#[test]
fn a_missing_sandbox_namespace_is_named_in_the_error() {
    let api = FakeApi::start(&["rt"]);
    let out = api.generate(&[]);
    assert_fails_with(&out, "namespaces \"openshell\" not found");
    assert!(api.state.lock().unwrap().secrets.is_empty());
}

#[test]
fn an_existing_secret_without_its_keys_is_refused() {
    let api = FakeApi::start(&["rt", "openshell"]);
    // The whole set exists, but one member is not what we would have made.
    for (ns, name, ty) in [
        ("rt", "openshell-server-tls", "kubernetes.io/tls"),
        ("rt", "openshell-client-tls", "kubernetes.io/tls"),
        ("openshell", "openshell-client-tls", "kubernetes.io/tls"),
        ("rt", "openshell-server-client-ca", "Opaque"),
        ("openshell", "openshell-server-client-ca", "Opaque"),
    ] {
        let data = if ty == "Opaque" {
            json!({"ca.crt": ""})
        } else {
            json!({"tls.crt": "", "tls.key": "", "ca.crt": ""})
        };
        api.state
            .lock()
            .unwrap()
            .secrets
            .insert((ns.into(), name.into()), json!({"type": ty, "data": data}));
    }
    api.state.lock().unwrap().secrets.insert(
        ("rt".into(), "openshell-server-tls".into()),
        json!({"type": "kubernetes.io/tls", "data": {"tls.crt": "", "ca.crt": ""}}),
    );
    let out = api.generate(&[]);
    assert_fails_with(&out, "Secret rt/openshell-server-tls lacks key \"tls.key\"");
}

#[test]
fn a_wrong_token_or_an_untrusted_server_fails_clearly() {
    let api = FakeApi::start(&["rt", "openshell"]);
    std::fs::write(api.dir.path().join("token"), "not-the-token").unwrap();
    assert_fails_with(&api.generate(&[]), "HTTP 401: Unauthorized");

    std::fs::write(api.dir.path().join("token"), TOKEN).unwrap();
    let other_ca = rcgen::generate_simple_self_signed(vec!["x".to_owned()]).unwrap();
    let other = api.dir.path().join("other-ca.crt");
    std::fs::write(&other, other_ca.cert.pem()).unwrap();
    let out = api.generate_with_ca(&other, &[]);
    assert_fails_with(
        &out,
        &format!(
            "TLS handshake with the API server https://{} failed",
            api.addr
        ),
    );
    assert!(api.state.lock().unwrap().secrets.is_empty());

    std::fs::write(&other, "not a certificate").unwrap();
    assert_fails_with(
        &api.generate_with_ca(&other, &[]),
        "holds no usable CA certificate",
    );
}

/// A token file holding a byte an HTTP header cannot carry (here 0x01, as a file mangled by
/// an editor or a bad copy would) is refused before anything is sent, naming the file and the
/// byte, never the token itself.
#[test]
fn a_token_with_a_control_byte_fails_clearly_and_sends_nothing() {
    let api = FakeApi::start(&["rt", "openshell"]);
    let token_file = api.dir.path().join("token");
    std::fs::write(&token_file, "  abc\u{1}def-secret-part\n").unwrap();
    let out = api.generate(&[]);
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_fails_with(
        &out,
        &format!(
            "ServiceAccount token file {} holds a control byte (0x01) at byte 5, which an HTTP \
             header cannot carry",
            token_file.display()
        ),
    );
    assert!(!err.contains("secret-part"), "the token was quoted: {err}");
    assert!(api.state.lock().unwrap().log.is_empty());
    assert!(api.state.lock().unwrap().secrets.is_empty());
}
