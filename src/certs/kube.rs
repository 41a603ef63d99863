//! Just enough of the Kubernetes REST API to read, create and delete Secrets, authenticated
//! as the pod's ServiceAccount over rustls. The hook Job runs our FROM-scratch image, which has
//! no kubectl and no shell, so this is how the certificates reach the cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::error::CertsError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the API server is and how we prove who we are.
pub struct ApiConfig {
    /// `https://host:port`; plain http is refused so the token never travels in clear.
    pub server: String,
    pub token_file: PathBuf,
    pub ca_file: PathBuf,
}

impl ApiConfig {
    /// The in-cluster defaults: the `kubernetes` Service from the env the kubelet injects.
    pub fn server_from_env() -> Option<String> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        Some(if host.contains(':') {
            format!("https://[{host}]:{port}")
        } else {
            format!("https://{host}:{port}")
        })
    }
}

pub struct Client {
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    /// `Bearer <token>`, checked once when the file is read (and marked sensitive).
    authorization: HeaderValue,
    server: String,
}

/// Split `https://host:port` (IPv6 in brackets) into its parts.
fn parse_server(url: &str) -> Result<(String, u16), String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or("only https:// is accepted: the ServiceAccount token must not travel in clear")?;
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return Err("expected no path after host:port".into());
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("unclosed '[' in IPv6 host")?;
        (h, after.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port = match port {
        None => 443,
        Some(p) => p.parse().map_err(|_| format!("bad port {p:?}"))?,
    };
    Ok((host.to_owned(), port))
}

impl Client {
    pub fn new(cfg: &ApiConfig) -> Result<Self, CertsError> {
        let (host, port) =
            parse_server(&cfg.server).map_err(|reason| CertsError::BadApiServer {
                url: cfg.server.clone(),
                reason,
            })?;
        let token =
            std::fs::read_to_string(&cfg.token_file).map_err(|source| CertsError::ReadFile {
                what: "ServiceAccount token",
                path: cfg.token_file.clone(),
                source,
            })?;
        let offset = token.len() - token.trim_start().len();
        let token = token.trim();
        if token.is_empty() {
            return Err(CertsError::EmptyToken {
                path: cfg.token_file.clone(),
            });
        }
        let authorization = bearer(token, offset, &cfg.token_file)?;
        let roots = load_roots(&cfg.ca_file)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| CertsError::TlsSetup { source })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name =
            ServerName::try_from(host.clone()).map_err(|_| CertsError::BadApiServer {
                url: cfg.server.clone(),
                reason: format!("{host:?} is not a valid TLS server name"),
            })?;
        Ok(Self {
            host,
            port,
            server_name,
            tls: TlsConnector::from(Arc::new(tls)),
            authorization,
            server: cfg.server.clone(),
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), CertsError> {
        let io_err = |source| CertsError::Connect {
            server: self.server.clone(),
            source,
        };
        let timed_out = || {
            io_err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "timed out",
            ))
        };
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(io_err)?;
        let tls = tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.tls.connect(self.server_name.clone(), tcp),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(|source| CertsError::Tls {
            server: self.server.clone(),
            source,
        })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| CertsError::Http {
                server: self.server.clone(),
                source,
            })?;
        let conn = tokio::spawn(conn);

        let host_header = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::HOST, host_header)
            .header(http::header::AUTHORIZATION, self.authorization.clone())
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::USER_AGENT, "openshell-sandbox-certs")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .expect("request parts are valid");
        let exchange = async {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        };
        let result = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| timed_out())?
            .map_err(|source| CertsError::Http {
                server: self.server.clone(),
                source,
            });
        conn.abort();
        result
    }

    fn api_error(method: &Method, path: &str, status: StatusCode, body: &[u8]) -> CertsError {
        // The API server explains itself in a Status object's `message`.
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(300).collect());
        CertsError::Api {
            method: method.to_string(),
            path: path.to_owned(),
            status: status.as_u16(),
            message,
        }
    }

    /// The Secret's `data` (decoded), or None when it does not exist.
    pub async fn get_secret(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, CertsError> {
        let path = format!("/api/v1/namespaces/{ns}/secrets/{name}");
        let (status, body) = self.call(Method::GET, &path, None).await?;
        match status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(None),
            s => return Err(Self::api_error(&Method::GET, &path, s, &body)),
        }
        let v: Value = serde_json::from_slice(&body).map_err(|_| CertsError::Api {
            method: "GET".into(),
            path: path.clone(),
            status: 200,
            message: "response is not a JSON object".into(),
        })?;
        let mut data = BTreeMap::new();
        if let Some(map) = v.get("data").and_then(Value::as_object) {
            for (k, val) in map {
                let decoded = val
                    .as_str()
                    .and_then(|s| B64.decode(s).ok())
                    .ok_or_else(|| CertsError::Api {
                        method: "GET".into(),
                        path: path.clone(),
                        status: 200,
                        message: format!("data key {k:?} is not base64"),
                    })?;
                data.insert(k.clone(), decoded);
            }
        }
        Ok(Some(data))
    }

    pub async fn create_secret(
        &self,
        ns: &str,
        name: &str,
        type_: &str,
        data: &BTreeMap<&str, &[u8]>,
    ) -> Result<(), CertsError> {
        let path = format!("/api/v1/namespaces/{ns}/secrets");
        let encoded: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String(B64.encode(v))))
            .collect();
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {
                    "app.kubernetes.io/managed-by": "openshell-sandbox-certs",
                    "app.kubernetes.io/part-of": "openshell",
                },
            },
            "type": type_,
            "data": encoded,
        });
        let (status, resp) = self
            .call(Method::POST, &path, Some(body.to_string().into_bytes()))
            .await?;
        if status == StatusCode::CREATED || status == StatusCode::OK {
            return Ok(());
        }
        Err(Self::api_error(&Method::POST, &path, status, &resp))
    }

    pub async fn delete_secret(&self, ns: &str, name: &str) -> Result<(), CertsError> {
        let path = format!("/api/v1/namespaces/{ns}/secrets/{name}");
        let (status, body) = self.call(Method::DELETE, &path, None).await?;
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(Self::api_error(&Method::DELETE, &path, status, &body))
    }
}

/// The `Authorization` value for `token`, which starts at byte `offset` of the file at `path`.
/// A byte an HTTP header cannot carry is refused here, by its value and place (the token itself
/// is never quoted back), rather than when the request is built.
fn bearer(token: &str, offset: usize, path: &Path) -> Result<HeaderValue, CertsError> {
    let mut value = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
        let reason = match token
            .bytes()
            .position(|b| b.is_ascii_control() && b != b'\t')
        {
            Some(i) => format!(
                "holds a control byte (0x{:02x}) at byte {}, which an HTTP header cannot carry",
                token.as_bytes()[i],
                offset + i
            ),
            None => "holds a byte an HTTP header cannot carry".to_owned(),
        };
        CertsError::BadToken {
            path: path.to_owned(),
            reason,
        }
    })?;
    value.set_sensitive(true);
    Ok(value)
}

fn load_roots(path: &Path) -> Result<rustls::RootCertStore, CertsError> {
    let pem = std::fs::read(path).map_err(|source| CertsError::ReadFile {
        what: "API server CA",
        path: path.into(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|_| CertsError::BadCa { path: path.into() })?;
        roots
            .add(cert)
            .map_err(|_| CertsError::BadCa { path: path.into() })?;
    }
    if roots.is_empty() {
        return Err(CertsError::BadCa { path: path.into() });
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::{bearer, parse_server};
    use crate::certs::error::CertsError;
    use std::path::Path;

    #[test]
    fn a_token_byte_a_header_cannot_carry_is_named_not_quoted() {
        let v = bearer("eyJhbGciOi.J9-_x", 0, Path::new("/t")).unwrap();
        assert_eq!(v.as_bytes(), b"Bearer eyJhbGciOi.J9-_x");
        assert!(v.is_sensitive());
        for (token, byte, at) in [("ab\x7fsecret", 0x7f, 4), ("\0secret", 0, 2)] {
            match bearer(token, 2, Path::new("/t")) {
                Err(e @ CertsError::BadToken { .. }) => {
                    let msg = e.to_string();
                    let want = format!("holds a control byte (0x{byte:02x}) at byte {at},");
                    assert!(msg.contains(&want), "{msg}");
                    assert!(!msg.contains("secret"), "{msg}");
                }
                other => panic!("{token:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn api_server_urls() {
        assert_eq!(
            parse_server("https://10.0.0.1:6443").unwrap(),
            ("10.0.0.1".into(), 6443)
        );
        assert_eq!(
            parse_server("https://[fd00::1]:443/").unwrap(),
            ("fd00::1".into(), 443)
        );
        assert_eq!(
            parse_server("https://kubernetes.default.svc").unwrap(),
            ("kubernetes.default.svc".into(), 443)
        );
        assert!(
            parse_server("http://10.0.0.1:80")
                .unwrap_err()
                .contains("only https://")
        );
        assert!(
            parse_server("https://h:x")
                .unwrap_err()
                .contains("bad port")
        );
        assert!(parse_server("https://h:1/api").is_err());
        assert!(parse_server("https://:1").is_err());
    }
}
