//! `run --credential NAME@HOST[:PORT]`: a credential the proxy holds for the run. Its real
//! value is read from our own environment variable `NAME` and never reaches the sandbox: the
//! command's `NAME` is OpenShell's placeholder `openshell:resolve:env:NAME`, which the proxy
//! replaces only in requests it admitted to HOST:PORT (443 by default). A policy file binds
//! the same way with `credential_binding: {provider: NAME}` on an endpoint (in `run` each
//! `--credential` is a provider of one credential, named after its variable); `--credential
//! NAME` alone then takes its endpoints from the file.

use std::ffi::OsString;

use crate::egress::credentials::{Binding, Credentials, policy_bindings};
use crate::policy::network::NetworkRules;

/// A `--credential` that cannot work, and why (a usage error, 125).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--credential {arg}: {why}")]
pub struct CredentialFlagError {
    pub arg: String,
    pub why: String,
}

/// The port of a binding without one.
pub const DEFAULT_PORT: u16 = 443;

/// One `--credential`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialFlag {
    pub name: String,
    /// `@HOST[:PORT]`.
    pub binding: Option<(String, u16)>,
}

fn bad(arg: &str, why: impl Into<String>) -> CredentialFlagError {
    CredentialFlagError {
        arg: arg.to_string(),
        why: why.into(),
    }
}

impl CredentialFlag {
    /// Parse `NAME[@HOST[:PORT]]`. NAME is what a placeholder can carry: `[A-Za-z0-9_]+`.
    pub fn parse(arg: &str) -> Result<CredentialFlag, CredentialFlagError> {
        let (name, at) = match arg.split_once('@') {
            Some((n, a)) => (n, Some(a)),
            None => (arg, None),
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(bad(
                arg,
                "NAME must be a variable name of letters, digits and '_' (NAME@HOST[:PORT])",
            ));
        }
        if name.starts_with("OPENSHELL_") {
            return Err(bad(arg, "OPENSHELL_* variables are the supervisor's own"));
        }
        let binding = match at {
            None => None,
            Some(t) => {
                let (host, port) = match t.rsplit_once(':') {
                    Some((h, p)) if !h.contains(':') => match p.parse::<u16>() {
                        Ok(0) | Err(_) => {
                            return Err(bad(arg, "the port must be a number from 1 to 65535"));
                        }
                        Ok(p) => (h, p),
                    },
                    Some(_) => return Err(bad(arg, "HOST must be a name or an IPv4 address")),
                    None => (t, DEFAULT_PORT),
                };
                if host.is_empty() || host.contains(['/', ' ', ',']) {
                    return Err(bad(arg, "the host after '@' is empty or not a host"));
                }
                Some((host.to_ascii_lowercase(), port))
            }
        };
        Ok(CredentialFlag {
            name: name.to_string(),
            binding,
        })
    }
}

/// The run's credential store: each `--credential`'s value from `lookup` (our environment),
/// bound to its `@HOST[:PORT]` and to every endpoint of `rules` whose `credential_binding`
/// names it. A missing or empty variable, a credential bound nowhere, or a binding no rule
/// allows is refused, naming the flag.
pub fn credentials(
    args: &[String],
    rules: Option<&NetworkRules>,
    lookup: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Credentials, CredentialFlagError> {
    let mut creds = Credentials::new(0, "");
    let mut named = Vec::new();
    let policy_bound = rules.map(policy_bindings).unwrap_or_default();
    for arg in args {
        let f = CredentialFlag::parse(arg)?;
        if named.contains(&f.name) {
            return Err(bad(arg, format!("{} is given twice", f.name)));
        }
        let value = match lookup(&f.name) {
            Some(v) if !v.is_empty() => v
                .into_string()
                .map_err(|_| bad(arg, format!("the variable {} is not valid UTF-8", f.name)))?,
            _ => {
                return Err(bad(
                    arg,
                    format!(
                        "the variable {} is not set (or empty) in this environment: its value is the credential",
                        f.name
                    ),
                ));
            }
        };
        let mut bound = Vec::new();
        if let Some((host, port)) = &f.binding {
            let allowed = rules.is_some_and(|r| {
                r.rules()
                    .iter()
                    .any(|rule| rule.endpoints.iter().any(|e| e.matches(host, *port)))
            });
            if !allowed {
                return Err(bad(
                    arg,
                    format!(
                        "no network rule allows {host}:{port}; add one (--allow-net {host}:{port}, or the policy's network_policies)"
                    ),
                ));
            }
            bound.push(Binding::new(host.clone(), *port));
        }
        bound.extend(
            policy_bound
                .iter()
                .filter(|(p, _)| *p == f.name)
                .map(|(_, b)| b.clone()),
        );
        if bound.is_empty() {
            return Err(bad(
                arg,
                format!(
                    "{} is bound to no endpoint: write NAME@HOST[:PORT], or `credential_binding: {{provider: {}}}` on an endpoint of the policy",
                    f.name, f.name
                ),
            ));
        }
        creds.insert(&f.name, value, bound);
        named.push(f.name);
    }
    for rule in rules.map(|r| r.rules()).unwrap_or_default() {
        for e in &rule.endpoints {
            if let Some(p) = &e.credential_provider
                && !named.contains(p)
            {
                tracing::warn!(target: "egress", "network_policies.{}: credential_binding names '{p}', but no --credential {p} was given: that endpoint gets no credential", rule.key);
            }
        }
    }
    Ok(creds)
}

/// One line per credential for `check --explain`: `NAME -> host:port, ...` (never a value).
pub fn describe(creds: &Credentials) -> Vec<String> {
    creds
        .describe()
        .into_iter()
        .map(|(k, bound)| {
            let to: Vec<String> = bound
                .iter()
                .map(|b| {
                    let path = if b.path.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", b.path)
                    };
                    format!("{}:{}{path}", b.host, b.port)
                })
                .collect();
            format!("{k} -> {}", to.join(", "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> NetworkRules {
        let p =
            crate::policy::openshell::from_yaml(&format!("version: 1\nnetwork_policies:\n{yaml}"))
                .unwrap();
        NetworkRules::compile(&p.network_policies).unwrap()
    }

    #[test]
    fn flags_parse_and_bad_ones_name_the_problem() {
        let f = CredentialFlag::parse("GH_TOKEN@API.github.com").unwrap();
        assert_eq!(f.binding, Some(("api.github.com".into(), 443)));
        let f = CredentialFlag::parse("K@h.test:8443").unwrap();
        assert_eq!(f.binding, Some(("h.test".into(), 8443)));
        assert_eq!(CredentialFlag::parse("K").unwrap().binding, None);
        for bad in [
            "",
            "@h",
            "A-B@h",
            "K@",
            "K@h:0",
            "K@h:x",
            "K@::1",
            "OPENSHELL_X@h",
        ] {
            let e = CredentialFlag::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--credential {bad}: ")), "{e}");
        }
    }

    #[test]
    fn values_come_from_the_environment_and_bindings_from_flags_and_the_policy() {
        let r = rules(
            "  api:\n    endpoints:\n      - {host: api.test, port: 443}\n      - {host: model.test, ports: [443, 8443], path: /v1/**, credential_binding: {provider: M}}\n    binaries: [{path: /usr/bin/curl}]\n",
        );
        let env = |k: &str| match k {
            "T" => Some("tee".into()),
            "M" => Some("em".into()),
            "E" => Some("".into()),
            _ => None,
        };
        let c = credentials(&["T@api.test".into(), "M".into()], Some(&r), &env).unwrap();
        assert_eq!(
            describe(&c),
            [
                "M -> model.test:443 /v1/**, model.test:8443 /v1/**",
                "T -> api.test:443"
            ]
        );
        assert!(c.holds_value("tee") && !format!("{c:?}").contains("tee"));
        for (args, why) in [
            (vec!["X@api.test"], "X is not set"),
            (vec!["E@api.test"], "E is not set (or empty)"),
            (
                vec!["T@other.test"],
                "no network rule allows other.test:443",
            ),
            (vec!["T"], "T is bound to no endpoint"),
            (vec!["T@api.test", "T@api.test"], "T is given twice"),
        ] {
            let args: Vec<String> = args.into_iter().map(String::from).collect();
            let e = credentials(&args, Some(&r), &env).unwrap_err().to_string();
            assert!(e.contains(why), "{args:?}: {e}");
        }
    }
}
