//! Client mTLS with rustls: trust only the configured CA, present the client certificate, verify
//! the server name. The files are read again for every new connection, so a rotated
//! Kubernetes Secret is picked up by the next reconnect without a restart.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// TLS material paths; read again for every new connection (Secret rotation).
#[derive(Debug, Clone)]
pub struct TlsPaths {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub server_name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} file {path} (OPENSHELL_TLS_{var}): {source}")]
    Read {
        what: &'static str,
        var: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {what} file {path} (OPENSHELL_TLS_{var}) holds no PEM {expected}")]
    Empty {
        what: &'static str,
        var: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error(
        "the CA file {path} (OPENSHELL_TLS_CA) holds a certificate that cannot be a trust anchor: {source}"
    )]
    BadCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("the client certificate {path} (OPENSHELL_TLS_CERT) is not valid X.509: {reason}")]
    BadCert { path: PathBuf, reason: String },
    #[error(
        "the client certificate {path} (OPENSHELL_TLS_CERT) {when} ({bound}); the gateway would refuse it"
    )]
    CertNotValidNow {
        path: PathBuf,
        when: &'static str,
        bound: String,
    },
    #[error(
        "the client certificate {cert} and key {key} (OPENSHELL_TLS_CERT / _KEY) cannot be used together: {source}"
    )]
    CertKey {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("`{0}` is not a valid TLS server name (set OPENSHELL_GATEWAY_TLS_SERVER_NAME)")]
    ServerName(String),
}

/// A TLS connector and the name the server's certificate must match, built from fresh reads of
/// the configured files.
pub struct TlsSetup {
    pub connector: tokio_rustls::TlsConnector,
    pub server_name: ServerName<'static>,
}

/// Read the CA, certificate and key and build the client configuration.
pub fn load(paths: &TlsPaths, endpoint_host: &str) -> Result<TlsSetup, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca_certs = read_certs(&paths.ca, "CA", "CA")?;
    let mut roots = RootCertStore::empty();
    for c in ca_certs {
        roots.add(c).map_err(|source| TlsError::BadCa {
            path: paths.ca.clone(),
            source,
        })?;
    }
    let chain = read_certs(&paths.cert, "client certificate", "CERT")?;
    check_validity(&paths.cert, &chain[0])?;
    let key = read_key(&paths.key)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::BadCa {
            path: paths.ca.clone(),
            source,
        })?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|source| TlsError::CertKey {
            cert: paths.cert.clone(),
            key: paths.key.clone(),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = paths.server_name.as_deref().unwrap_or(endpoint_host);
    let server_name =
        ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(name.to_owned()))?;
    Ok(TlsSetup {
        connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        server_name,
    })
}

fn read_file(path: &Path, what: &'static str, var: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        var,
        path: path.to_owned(),
        source,
    })
}

fn read_certs(
    path: &Path,
    what: &'static str,
    var: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(path, what, var)?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut BufReader::new(&pem[..]))
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            what,
            var,
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            var,
            path: path.to_owned(),
            expected: "CERTIFICATE block",
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_file(path, "client key", "KEY")?;
    rustls_pemfile::private_key(&mut BufReader::new(&pem[..]))
        .map_err(|source| TlsError::Read {
            what: "client key",
            var: "KEY",
            path: path.to_owned(),
            source,
        })?
        .ok_or_else(|| TlsError::Empty {
            what: "client key",
            var: "KEY",
            path: path.to_owned(),
            expected: "PRIVATE KEY block",
        })
}

/// The gateway answers an expired client certificate with a bare TLS alert; checking here
/// turns that into an error that names the file.
fn check_validity(path: &Path, cert: &CertificateDer<'_>) -> Result<(), TlsError> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| TlsError::BadCert {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    let v = parsed.validity();
    let now = x509_parser::time::ASN1Time::now();
    if now > v.not_after {
        return Err(TlsError::CertNotValidNow {
            path: path.to_owned(),
            when: "has expired",
            bound: format!("not after {}", v.not_after),
        });
    }
    if now < v.not_before {
        return Err(TlsError::CertNotValidNow {
            path: path.to_owned(),
            when: "is not valid yet",
            bound: format!("not before {}", v.not_before),
        });
    }
    Ok(())
}
