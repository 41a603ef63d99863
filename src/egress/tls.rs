//! TLS interception: the sandbox's own CA, made in memory at start (its key is never written
//! anywhere), a leaf per CONNECT host signed on demand, and the upstream side verified
//! against the Mozilla roots and the system bundle.
//!
//! The child trusts the CA only through the files of [`CaFiles`] and the variables of
//! [`ca_env`]; nothing is added to the image's own trust store.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Leaf certificates kept at most; past it the cache is emptied and refilled on demand.
pub const LEAF_CACHE: usize = 256;

/// Where the view shows the CA files (OpenShell's `/etc/openshell-tls`).
pub const TLS_DIR: &str = "/etc/openshell-tls";
/// The CA alone.
pub const CA_FILE: &str = "openshell-ca.pem";
/// The system bundle followed by the CA.
pub const BUNDLE_FILE: &str = "ca-bundle.pem";

/// Where the system bundle is looked for, first found wins (OpenShell's list).
pub const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating the sandbox CA: {0}")]
    Generate(#[source] rcgen::Error),
    #[error("signing a leaf certificate for {host}: {source}")]
    Leaf {
        host: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("building a TLS configuration: {0}")]
    Config(#[source] rustls::Error),
    #[error("'{0}' is not a name a certificate can carry")]
    Name(String),
}

/// The sandbox's CA. The key lives in this value only.
pub struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pem: String,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl SandboxCa {
    /// A fresh CA: CN `OpenShell Sandbox CA`, O `OpenShell`, may sign certificates and CRLs.
    pub fn generate() -> Result<SandboxCa, TlsError> {
        let key = KeyPair::generate().map_err(TlsError::Generate)?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "OpenShell Sandbox CA");
        dn.push(DnType::OrganizationName, "OpenShell");
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(30);
        let cert = p.self_signed(&key).map_err(TlsError::Generate)?;
        Ok(SandboxCa {
            der: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(p, key),
            leaves: Mutex::new(HashMap::new()),
            provider: provider(),
        })
    }

    /// The CA certificate (no key), PEM.
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.der
    }

    /// The server side for `host` (the CONNECT host, lower-case): a leaf whose SAN and CN are
    /// `host`, chain [leaf, CA], ALPN `http/1.1` only. Signed once, then cached.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        if let Some(c) = self
            .leaves
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(host)
        {
            return Ok(c.clone());
        }
        let config = Arc::new(self.sign(host)?);
        let mut m = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= LEAF_CACHE {
            m.clear();
        }
        m.insert(host.to_string(), config.clone());
        Ok(config)
    }

    fn sign(&self, host: &str) -> Result<ServerConfig, TlsError> {
        let leaf_err = |source| TlsError::Leaf {
            host: host.to_string(),
            source,
        };
        let key = KeyPair::generate().map_err(leaf_err)?;
        let mut p = CertificateParams::default();
        let san = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.to_string()
                    .try_into()
                    .map_err(|_| TlsError::Name(host.to_string()))?,
            ),
        };
        p.subject_alt_names = vec![san];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        p.distinguished_name = dn;
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(7);
        let cert = p.signed_by(&key, &self.issuer).map_err(leaf_err)?;
        let chain = vec![cert.der().clone(), self.der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut c = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(TlsError::Config)?;
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(c)
    }

    /// The public files for the view, as (name, contents): the CA alone, and the first system
    /// bundle found (read from `system_root`, `/` in production) followed by the CA.
    pub fn files(&self, system_root: &Path) -> CaFiles {
        let mut bundle = SYSTEM_BUNDLES
            .iter()
            .find_map(|p| std::fs::read_to_string(system_root.join(&p[1..])).ok())
            .unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&self.pem);
        CaFiles {
            ca_pem: self.pem.clone(),
            bundle_pem: bundle,
        }
    }
}

/// What the view shows under [`TLS_DIR`].
#[derive(Debug, Clone)]
pub struct CaFiles {
    /// [`CA_FILE`].
    pub ca_pem: String,
    /// [`BUNDLE_FILE`].
    pub bundle_pem: String,
}

/// The child's trust variables, as OpenShell sets them: `NODE_EXTRA_CA_CERTS` and `DENO_CERT`
/// name the CA alone (Node and Deno add it to their own roots); `SSL_CERT_FILE`,
/// `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE` and `GIT_SSL_CAINFO` name the combined bundle (they
/// replace the roots). `dir` is where the view shows the files ([`TLS_DIR`]).
pub fn ca_env(dir: &str) -> Vec<(&'static str, String)> {
    let ca = format!("{dir}/{CA_FILE}");
    let bundle = format!("{dir}/{BUNDLE_FILE}");
    vec![
        ("NODE_EXTRA_CA_CERTS", ca.clone()),
        ("DENO_CERT", ca),
        ("SSL_CERT_FILE", bundle.clone()),
        ("REQUESTS_CA_BUNDLE", bundle.clone()),
        ("CURL_CA_BUNDLE", bundle.clone()),
        ("GIT_SSL_CAINFO", bundle),
    ]
}

/// The upstream side: the Mozilla roots plus the system bundle, SNI = the CONNECT host, ALPN
/// `http/1.1`, no client certificate.
pub struct Upstream {
    connector: tokio_rustls::TlsConnector,
}

impl Upstream {
    /// Roots: webpki's Mozilla set and every certificate of the first system bundle found.
    pub fn system() -> Result<Upstream, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(pem) = SYSTEM_BUNDLES.iter().find_map(|p| std::fs::read(p).ok()) {
            let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
                .filter_map(Result::ok)
                .collect();
            roots.add_parsable_certificates(certs);
        }
        Self::with_roots(roots)
    }

    /// Test builds only: trust `pem` (the tests' own upstream CA) besides the system roots.
    /// Never compiled into release or static builds (`SECURITY.md`, test knobs).
    #[cfg(feature = "test-pause-points")]
    pub fn system_and_test_roots(pem: &str) -> Result<Upstream, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_bytes())
            .filter_map(Result::ok)
            .collect();
        roots.add_parsable_certificates(certs);
        Self::with_roots(roots)
    }

    fn with_roots(roots: RootCertStore) -> Result<Upstream, TlsError> {
        let mut c = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Upstream {
            connector: tokio_rustls::TlsConnector::from(Arc::new(c)),
        })
    }

    /// The TLS session to the upstream, verified for `host`.
    pub async fn connect<S>(
        &self,
        host: &str,
        tcp: S,
    ) -> io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a server name"))?;
        self.connector.connect(name, tcp).await
    }
}
