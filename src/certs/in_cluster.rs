//! `certs generate --in-cluster`: the set of Secrets, created all at once through the API or
//! kept when all exist, and removed again when a creation fails.

use std::collections::BTreeMap;

use super::args::GenerateArgs;
use super::error::CertsError;
use super::{kube, pki};

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

pub(super) async fn generate(a: &GenerateArgs, sans: &[String]) -> Result<Vec<String>, CertsError> {
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
