//! `certs`' flags, and the Kubernetes names among them checked before anything is made.

use std::path::PathBuf;

use clap::{ArgGroup, Parser, Subcommand};

use super::error::CertsError;

#[derive(Debug, Parser)]
#[command(
    name = "openshell-sandbox certs",
    bin_name = "openshell-sandbox certs",
    about = "mTLS certificates for the gateway",
    version = crate::cli::VERSION
)]
pub(super) struct CertsCli {
    #[command(subcommand)]
    pub(super) command: CertsCommand,
}

#[derive(Debug, Subcommand)]
pub(super) enum CertsCommand {
    /// Generate a CA, a server and a client certificate (kept when they already exist).
    Generate(GenerateArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("output").required(true).args(["out_dir", "in_cluster"])))]
pub(super) struct GenerateArgs {
    /// Write PEM files under DIR (server/, client/, client-ca/).
    #[arg(long, value_name = "DIR")]
    pub(super) out_dir: Option<PathBuf>,
    /// Create Kubernetes Secrets through the API, as this pod's ServiceAccount.
    #[arg(long)]
    pub(super) in_cluster: bool,
    /// The release namespace: where the gateway's Service lives (its SANs) and its Secrets go.
    #[arg(long, env = "POD_NAMESPACE")]
    pub(super) namespace: String,
    /// Where sandbox pods run; it also receives the client and client-CA Secrets.
    #[arg(long, default_value = "openshell")]
    pub(super) sandbox_namespace: String,
    /// The gateway Service name, the first SAN of the server certificate.
    #[arg(long, default_value = "openshell")]
    pub(super) service_name: String,
    #[arg(long, default_value = "cluster.local")]
    pub(super) cluster_domain: String,
    /// An extra DNS name or IP address for the server certificate (repeatable).
    #[arg(long = "san", value_name = "NAME")]
    pub(super) extra_sans: Vec<String>,
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
    pub(super) validity_days: u32,
    #[arg(long, default_value = "openshell-server-tls")]
    pub(super) server_secret: String,
    #[arg(long, default_value = "openshell-client-tls")]
    pub(super) client_secret: String,
    #[arg(long, default_value = "openshell-server-client-ca")]
    pub(super) client_ca_secret: String,
    /// Also create this Secret (key `secret`, 32 random bytes as hex) when it is missing: the
    /// SSH handshake key v0.0.36 gateways need. Kept when it exists.
    #[arg(long, requires = "in_cluster", value_name = "NAME")]
    pub(super) ssh_handshake_secret: Option<String>,
    /// API server URL [default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT].
    #[arg(long, requires = "in_cluster", value_name = "URL")]
    pub(super) api_server: Option<String>,
    #[arg(long, requires = "in_cluster", default_value = concat!("/var/run/secrets/kubernetes.io/serviceaccount", "/token"))]
    pub(super) token_file: PathBuf,
    /// CA bundle that signs the API server's certificate.
    #[arg(long, requires = "in_cluster", default_value = concat!("/var/run/secrets/kubernetes.io/serviceaccount", "/ca.crt"))]
    pub(super) ca_file: PathBuf,
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

pub(super) fn validate_names(a: &GenerateArgs) -> Result<(), CertsError> {
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
