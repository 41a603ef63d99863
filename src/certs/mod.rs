//! `certs generate`: the mTLS CA, server and client certificates for the gateway.
//!
//! Two outputs:
//! - `--out-dir DIR`: PEM files laid out like the Secret mounts (`server/`, `client/`,
//!   `client-ca/`), for local use and tests.
//! - `--in-cluster`: Secrets created through the Kubernetes API as the pod's ServiceAccount,
//!   for the chart's pre-install hook Job. The client Secret and the client-CA Secret go into
//!   both the release namespace and the sandbox namespace.
//!
//! Both are idempotent as a set: when everything exists it is kept, when nothing exists all is
//! created, and a partial set is an error that says what exists and what is missing (mixing a
//! new CA with old certificates would break mTLS silently). A failed run removes what it made.

mod kube;
mod out_dir;
mod pki;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgGroup, CommandFactory, Parser, Subcommand};

pub use pki::server_names;

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

#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox certs",
    bin_name = "openshell-sandbox certs",
    about = "mTLS certificates for the gateway",
    version = crate::cli::VERSION
)]
struct CertsCli {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Generate a CA, a server and a client certificate (kept when they already exist).
    Generate(GenerateArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("output").required(true).args(["out_dir", "in_cluster"])))]
struct GenerateArgs {
    /// Write PEM files under DIR (server/, client/, client-ca/).
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Create Kubernetes Secrets through the API, as this pod's ServiceAccount.
    #[arg(long)]
    in_cluster: bool,
    /// The release namespace: where the gateway's Service lives (its SANs) and its Secrets go.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// Where sandbox pods run; it also receives the client and client-CA Secrets.
    #[arg(long, default_value = "openshell")]
    sandbox_namespace: String,
    /// The gateway Service name, the first SAN of the server certificate.
    #[arg(long, default_value = "openshell")]
    service_name: String,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// An extra DNS name or IP address for the server certificate (repeatable).
    #[arg(long = "san", value_name = "NAME")]
    extra_sans: Vec<String>,
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
    validity_days: u32,
    #[arg(long, default_value = "openshell-server-tls")]
    server_secret: String,
    #[arg(long, default_value = "openshell-client-tls")]
    client_secret: String,
    #[arg(long, default_value = "openshell-server-client-ca")]
    client_ca_secret: String,
    /// Also create this Secret (key `secret`, 32 random bytes as hex) when it is missing: the
    /// SSH handshake key v0.0.36 gateways need. Kept when it exists.
    #[arg(long, requires = "in_cluster", value_name = "NAME")]
    ssh_handshake_secret: Option<String>,
    /// API server URL [default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT].
    #[arg(long, requires = "in_cluster", value_name = "URL")]
    api_server: Option<String>,
    #[arg(long, requires = "in_cluster", default_value = concat!("/var/run/secrets/kubernetes.io/serviceaccount", "/token"))]
    token_file: PathBuf,
    /// CA bundle that signs the API server's certificate.
    #[arg(long, requires = "in_cluster", default_value = concat!("/var/run/secrets/kubernetes.io/serviceaccount", "/ca.crt"))]
    ca_file: PathBuf,
}

/// `certs`' flags, for completions and man pages.
pub fn command() -> clap::Command {
    CertsCli::command()
}

/// `openshell-sandbox certs ...`; `argv[0]` is `certs`.
pub fn main(argv: &[OsString]) -> Result<ExitCode, CertsError> {
    let cli = crate::cli::parsed_or_exit(CertsCli::try_parse_from(argv), argv);
    let CertsCommand::Generate(args) = cli.command;
    validate_names(&args)?;
    let sans = server_names(
        &args.service_name,
        &args.namespace,
        &args.cluster_domain,
        &args.extra_sans,
    );
    if let Some(dir) = &args.out_dir {
        let lines = out_dir::generate(dir, &sans, args.validity_days).map_err(|source| {
            CertsError::OutDir {
                dir: dir.clone(),
                source: Box::new(source),
            }
        })?;
        lines.iter().for_each(|l| println!("{l}"));
        return Ok(ExitCode::SUCCESS);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| CertsError::Runtime { source })?;
    let lines = rt
        .block_on(in_cluster(&args, &sans))
        .map_err(|source| CertsError::InCluster {
            source: Box::new(source),
        })?;
    lines.iter().for_each(|l| println!("{l}"));
    Ok(ExitCode::SUCCESS)
}

/// RFC 1123 names as the API server checks them, so a typo fails here with a clear message
/// rather than as an HTTP 422 (or a wrong URL path) later.
fn check_name(what: &'static str, value: &str, max: usize) -> Result<(), CertsError> {
    let bad = |reason| CertsError::BadName {
        what,
        value: value.to_owned(),
        reason,
    };
    if value.is_empty() || value.len() > max {
        return Err(bad(
            "length must be 1..=63 (namespaces) or 1..=253 (Secrets)",
        ));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(bad(
            "only lowercase letters, digits, '-' and '.' are allowed",
        ));
    }
    let edge = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !edge(value.as_bytes()[0]) || !edge(value.as_bytes()[value.len() - 1]) {
        return Err(bad("must start and end with a letter or digit"));
    }
    if max == 63 && value.contains('.') {
        return Err(bad("a namespace may not contain '.'"));
    }
    Ok(())
}

fn validate_names(a: &GenerateArgs) -> Result<(), CertsError> {
    check_name("namespace", &a.namespace, 63)?;
    check_name("sandbox namespace", &a.sandbox_namespace, 63)?;
    check_name("service name", &a.service_name, 63)?;
    check_name("server Secret", &a.server_secret, 253)?;
    check_name("client Secret", &a.client_secret, 253)?;
    check_name("client-CA Secret", &a.client_ca_secret, 253)?;
    if let Some(s) = &a.ssh_handshake_secret {
        check_name("SSH handshake Secret", s, 253)?;
    }
    Ok(())
}

/// What one Secret of the set holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Server,
    Client,
    ClientCa,
}

impl Role {
    fn secret_type(self) -> &'static str {
        match self {
            // The client-CA Secret holds no key, which kubernetes.io/tls would require.
            Role::ClientCa => "Opaque",
            _ => "kubernetes.io/tls",
        }
    }
    fn keys(self) -> &'static [&'static str] {
        match self {
            Role::ClientCa => &["ca.crt"],
            _ => &["tls.crt", "tls.key", "ca.crt"],
        }
    }
}

struct SecretRef {
    ns: String,
    name: String,
    role: Role,
}

impl SecretRef {
    fn label(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }
}

fn secret_set(a: &GenerateArgs) -> Vec<SecretRef> {
    let mut set = vec![SecretRef {
        ns: a.namespace.clone(),
        name: a.server_secret.clone(),
        role: Role::Server,
    }];
    let mut namespaces = vec![a.namespace.clone()];
    if a.sandbox_namespace != a.namespace {
        namespaces.push(a.sandbox_namespace.clone());
    }
    for ns in &namespaces {
        set.push(SecretRef {
            ns: ns.clone(),
            name: a.client_secret.clone(),
            role: Role::Client,
        });
        set.push(SecretRef {
            ns: ns.clone(),
            name: a.client_ca_secret.clone(),
            role: Role::ClientCa,
        });
    }
    set
}

fn data_for(role: Role, b: &pki::Bundle) -> BTreeMap<&'static str, &[u8]> {
    let leaf = match role {
        Role::Server => &b.server,
        Role::Client => &b.client,
        Role::ClientCa => return BTreeMap::from([("ca.crt", b.ca_pem.as_bytes())]),
    };
    BTreeMap::from([
        ("tls.crt", leaf.cert_pem.as_bytes()),
        ("tls.key", leaf.key_pem.as_bytes()),
        ("ca.crt", leaf.ca_pem.as_bytes()),
    ])
}

async fn in_cluster(a: &GenerateArgs, sans: &[String]) -> Result<Vec<String>, CertsError> {
    let server = match &a.api_server {
        Some(s) => s.clone(),
        None => kube::ApiConfig::server_from_env().ok_or(CertsError::NoApiServer)?,
    };
    let client = kube::Client::new(&kube::ApiConfig {
        server,
        token_file: a.token_file.clone(),
        ca_file: a.ca_file.clone(),
    })?;
    let mut lines = Vec::new();

    let set = secret_set(a);
    let (mut present, mut missing) = (Vec::new(), Vec::new());
    for s in &set {
        match client.get_secret(&s.ns, &s.name).await? {
            Some(data) => {
                if let Some(key) = s.role.keys().iter().find(|k| !data.contains_key(**k)) {
                    return Err(CertsError::Incomplete {
                        what: format!("Secret {}", s.label()),
                        key: (*key).to_owned(),
                    });
                }
                present.push(s.label());
            }
            None => missing.push(s.label()),
        }
    }
    if missing.is_empty() {
        lines.extend(
            set.iter()
                .map(|s| format!("kept existing Secret {}", s.label())),
        );
    } else if !present.is_empty() {
        return Err(CertsError::Partial { present, missing });
    } else {
        let bundle = pki::generate(sans, a.validity_days)?;
        let mut created: Vec<&SecretRef> = Vec::new();
        for s in &set {
            if let Err(e) = client
                .create_secret(
                    &s.ns,
                    &s.name,
                    s.role.secret_type(),
                    &data_for(s.role, &bundle),
                )
                .await
            {
                return Err(rollback(&client, &created, e).await);
            }
            created.push(s);
            lines.push(format!(
                "created Secret {} ({})",
                s.label(),
                s.role.secret_type()
            ));
        }
    }

    if let Some(name) = &a.ssh_handshake_secret {
        let label = format!("{}/{name}", a.namespace);
        match client.get_secret(&a.namespace, name).await? {
            Some(data) if data.contains_key("secret") => {
                lines.push(format!("kept existing Secret {label}"))
            }
            Some(_) => {
                return Err(CertsError::Incomplete {
                    what: format!("Secret {label}"),
                    key: "secret".into(),
                });
            }
            None => {
                let key = hex::encode(rand::random::<[u8; 32]>());
                client
                    .create_secret(
                        &a.namespace,
                        name,
                        "Opaque",
                        &BTreeMap::from([("secret", key.as_bytes())]),
                    )
                    .await?;
                lines.push(format!("created Secret {label} (Opaque)"));
            }
        }
    }
    Ok(lines)
}

/// Undo this run's creations so that a rerun starts from nothing rather than a partial set.
async fn rollback(client: &kube::Client, created: &[&SecretRef], cause: CertsError) -> CertsError {
    let mut failures = Vec::new();
    for s in created.iter().rev() {
        if let Err(e) = client.delete_secret(&s.ns, &s.name).await {
            failures.push(format!("{}: {e}", s.label()));
        }
    }
    if failures.is_empty() {
        cause
    } else {
        CertsError::RollbackFailed {
            source: Box::new(cause),
            created: created.iter().map(|s| s.label()).collect(),
            rollback: failures.join("; "),
        }
    }
}
