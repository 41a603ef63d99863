//! The error of `certs generate`, which every part of it returns.

use std::io;
use std::path::PathBuf;

/// Errors of `certs generate`; each names the file, Secret or server concerned.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("certs generate --out-dir {}", dir.display())]
    OutDir {
        dir: PathBuf,
        #[source]
        source: Box<CertsError>,
    },
    #[error("certs generate --in-cluster")]
    InCluster {
        #[source]
        source: Box<CertsError>,
    },
    #[error("cannot generate certificates")]
    Generate {
        #[source]
        source: rcgen::Error,
    },
    #[error("{name:?} is not a valid DNS name or IP address for a certificate")]
    BadSan { name: String },
    #[error("{what} {value:?} is not a valid Kubernetes name: {reason}")]
    BadName {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("cannot read {what} {path}")]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("ServiceAccount token file {path} is empty")]
    EmptyToken { path: PathBuf },
    #[error("ServiceAccount token file {path} {reason}")]
    BadToken { path: PathBuf, reason: String },
    #[error("{path} holds no usable CA certificate (PEM)")]
    BadCa { path: PathBuf },
    #[error("no API server: KUBERNETES_SERVICE_HOST is unset (not in a pod?); pass --api-server")]
    NoApiServer,
    #[error("API server {url:?} is not usable: {reason}")]
    BadApiServer { url: String, reason: String },
    #[error("cannot set up TLS")]
    TlsSetup {
        #[source]
        source: rustls::Error,
    },
    #[error("cannot connect to the API server {server}")]
    Connect {
        server: String,
        #[source]
        source: io::Error,
    },
    #[error("TLS handshake with the API server {server} failed")]
    Tls {
        server: String,
        #[source]
        source: io::Error,
    },
    #[error("HTTP exchange with the API server {server} failed")]
    Http {
        server: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{method} {path} was refused with HTTP {status}: {message}")]
    Api {
        method: String,
        path: String,
        status: u16,
        message: String,
    },
    #[error("existing {what} lacks key {key:?}; delete it so the set can be regenerated")]
    Incomplete { what: String, key: String },
    #[error(
        "only some of the certificate set exists: present {present:?}, missing {missing:?}. \
         A partial set cannot be completed without a new CA; delete the present ones to \
         regenerate everything, or restore the missing ones"
    )]
    Partial {
        present: Vec<String>,
        missing: Vec<String>,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{source}; rollback of {created:?} also failed: {rollback}")]
    RollbackFailed {
        #[source]
        source: Box<CertsError>,
        created: Vec<String>,
        rollback: String,
    },
    #[error("cannot start the async runtime")]
    Runtime {
        #[source]
        source: io::Error,
    },
}
