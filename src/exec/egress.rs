//! The egress proxy wired into a sandbox (`docs/egress.md`): the network rules of a policy
//! file and of `--allow-net`, the proxy started in the sandbox's own network namespace, the
//! children's proxy variables, and `check --egress`'s answer from the same decision.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use crate::egress::{
    self, Caller, Counts, CredentialStore, Credentials, Decision, EventSink, ExecKey, PolicyHandle,
    PolicyState, ProxyConfig, ProxyHandle,
};
use crate::policy::network::NetworkRules;
use crate::policy::openshell::{NetworkBinary, NetworkEndpoint, NetworkPolicyRule};

use super::interception::Interception;
use super::{RunError, Sandbox};

/// The port of an `--allow-net HOST` without one: HTTPS, what package indexes, forges and
/// APIs serve.
pub const ALLOW_NET_DEFAULT_PORT: u16 = 443;
/// The binary of an `--allow-net` without one: every executable of the sandbox. OpenShell's
/// rule without binaries matches nothing, which would make the quick form useless; a person
/// who names a host on the command line means "this command may reach it", whichever of its
/// programs (pip's Python, git's helpers, a shell's curl) makes the connection. The host and
/// port stay pinned; name a binary to narrow it.
pub const ALLOW_NET_DEFAULT_BINARY: &str = "/**";

pub use super::egress_error::EgressError;

/// One `--allow-net HOST[:PORT][,BINARY]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowNet {
    pub host: String,
    pub port: u16,
    pub binary: String,
}

impl AllowNet {
    /// Parse `HOST[:PORT][,BINARY]`; `[v6]:PORT` for an IPv6 literal. The host and binary are
    /// validated later, by the same compiler as a policy file's rules.
    pub fn parse(arg: &str) -> Result<AllowNet, EgressError> {
        let bad = |why: &str| EgressError::AllowNet {
            arg: arg.to_string(),
            why: why.to_string(),
        };
        let (target, binary) = match arg.split_once(',') {
            Some((_, "")) => return Err(bad("the binary after ',' is empty")),
            Some((t, b)) => (t, b.to_string()),
            None => (arg, ALLOW_NET_DEFAULT_BINARY.to_string()),
        };
        let (host, port) = if let Some(rest) = target.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 literal needs its closing ']'"))?;
            match after {
                "" => (h, None),
                p => (
                    h,
                    Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad("expected ':PORT' after ']'"))?,
                    ),
                ),
            }
        } else {
            match target.rsplit_once(':') {
                Some((h, _)) if h.contains(':') => {
                    return Err(bad("write an IPv6 literal in brackets: [::1]:443"));
                }
                Some((h, p)) => (h, Some(p)),
                None => (target, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is empty (HOST[:PORT][,BINARY])"));
        }
        if let Some(why) = crate::policy::network::unreachable_host(host) {
            return Err(bad(&why));
        }
        let port = match port {
            None => ALLOW_NET_DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(bad("the port must be a number from 1 to 65535")),
                Ok(n) => n,
            },
        };
        Ok(AllowNet {
            host: host.to_string(),
            port,
            binary,
        })
    }

    /// The key of its rule: `allow-net-<n>`, after the file's own rules' keys in order of
    /// mention only when they are not named so themselves.
    fn key(i: usize) -> String {
        format!("allow-net-{}", i + 1)
    }

    fn rule(&self) -> NetworkPolicyRule {
        NetworkPolicyRule {
            name: format!("--allow-net {}:{}", self.host, self.port),
            endpoints: vec![NetworkEndpoint {
                host: self.host.clone(),
                port: self.port,
                ..NetworkEndpoint::default()
            }],
            binaries: vec![NetworkBinary {
                path: self.binary.clone(),
                ..NetworkBinary::default()
            }],
        }
    }
}

/// The network rules of a sandbox: the file's `network_policies` plus one rule per
/// `--allow-net`; `None` when there are none (no proxy). Every rule is validated here, so a
/// bad one refuses the run naming its key.
pub fn network_rules(
    file: Option<&BTreeMap<String, NetworkPolicyRule>>,
    allow_net: &[String],
) -> Result<Option<NetworkRules>, EgressError> {
    let mut all = file.cloned().unwrap_or_default();
    for (i, arg) in allow_net.iter().enumerate() {
        let a = AllowNet::parse(arg)?;
        let rule = a.rule();
        let key = AllowNet::key(i);
        NetworkRules::compile(&BTreeMap::from([(key.clone(), rule.clone())])).map_err(|e| {
            EgressError::AllowNet {
                arg: arg.clone(),
                why: e.message,
            }
        })?;
        all.insert(key, rule);
    }
    if all.is_empty() {
        return Ok(None);
    }
    let mut rules = NetworkRules::compile(&all).map_err(EgressError::Rules)?;
    // The view is made of the supervisor's own paths: a policy's symlinked binary leads to the
    // same targets there.
    rules.expand_binary_links(&|p| egress::procfs::links_in_root(Path::new("/"), p));
    for w in rules.warnings() {
        tracing::warn!(target: "egress", "network_policies: {w}");
    }
    Ok(Some(rules))
}

/// [`network_rules`] for a mapped `policy`: rules need the sandbox's own network namespace
/// (`--network none`, the default), which the proxy's listener goes into.
pub fn rules_for(
    policy: &crate::policy::Policy,
    file: Option<&BTreeMap<String, NetworkPolicyRule>>,
    allow_net: &[String],
) -> Result<Option<NetworkRules>, EgressError> {
    let rules = network_rules(file, allow_net)?;
    if rules.is_some() && policy.network == crate::policy::NetworkMode::All {
        return Err(EgressError::NetworkAll);
    }
    Ok(rules)
}

impl EgressError {
    /// Name the policy file a rule of it was refused in.
    pub fn in_file(self, path: &Path) -> EgressError {
        match self {
            EgressError::Rules(source) => EgressError::RulesInFile {
                path: path.to_path_buf(),
                source,
            },
            e => e,
        }
    }
}

/// Where the proxy resolves names: the sandbox's `/etc/hosts` (the view shows the
/// supervisor's own file where it grants `/etc`), then the system resolver.
pub fn resolver() -> Arc<dyn egress::Resolve> {
    Arc::new(egress::SandboxResolver::new(
        Some("/etc/hosts".into()),
        true,
    ))
}

/// Start `sandbox`'s proxy on 10.200.0.1:3128 in its network namespace, keeping `policy`'s
/// current revision, with `config` (its inspector and counters). Must be called inside a
/// tokio runtime; the proxy stops when the handle is dropped.
pub fn start(
    sandbox: &Sandbox,
    policy: PolicyHandle,
    events: Arc<dyn EventSink>,
    config: ProxyConfig,
) -> Result<ProxyHandle, EgressError> {
    let netns = sandbox.net_namespace().ok_or(EgressError::NoNamespace)?;
    let socks = egress::netns::open_in(netns, egress::netns::PROXY_ADDR)?;
    let identity =
        egress::procfs::ProcIdentity::new(netns, socks.diag).map_err(|source| EgressError::Io {
            what: "opening the sandbox's process table",
            source,
        })?;
    egress::Proxy::start(
        socks.listener,
        policy,
        Arc::new(identity),
        resolver(),
        events,
        config,
    )
    .map_err(|source| EgressError::Io {
        what: "registering the listener",
        source,
    })
}

/// The proxy's config for a sandbox: its interceptor (TLS, rules, `credentials`), counting
/// request decisions into the proxy's counters.
pub fn proxy_config(
    sandbox: &Sandbox,
    interception: &Interception,
    credentials: CredentialStore,
    events: Arc<dyn EventSink>,
) -> ProxyConfig {
    let counters = Arc::new(egress::Counters::default());
    let interceptor = interception
        .interceptor(sandbox.view_files(), credentials, events)
        .counted(counters.clone());
    ProxyConfig {
        inspector: Some(Arc::new(interceptor)),
        counters,
        ..ProxyConfig::default()
    }
}

/// Add OpenShell's proxy variables to a child's environment. A variable the caller set
/// already (`--env`) is kept: the variables only tell clients where the proxy is, and a
/// client that goes elsewhere finds no route.
pub fn add_child_env(env: &mut Vec<(OsString, OsString)>) {
    for (k, v) in egress::child_env(egress::netns::PROXY_ADDR) {
        if !env.iter().any(|(ek, _)| ek == k) {
            env.push((k.into(), v.into()));
        }
    }
}

/// Put `vars` in a child's environment, replacing what is there: the trust variables and the
/// credential placeholders must be the proxy's, whatever `--env` or `--inherit-env` said (an
/// inherited `NAME` would be the real value of a `--credential NAME`).
pub fn set_child_env<K: AsRef<str>>(env: &mut Vec<(OsString, OsString)>, vars: &[(K, String)]) {
    for (k, v) in vars {
        env.retain(|(ek, _)| ek.as_os_str() != k.as_ref());
        env.push((k.as_ref().into(), v.into()));
    }
}

/// What `run` prepares for its proxy before the sandbox exists: the credentials
/// (`--credential`) and the CA, whose public files the view is to show.
pub struct RunPlan {
    credentials: Credentials,
    interception: Interception,
}

/// `run`'s plan when it has network rules (the view of `policy` then shows the CA's files);
/// a `--credential` without rules is refused.
pub fn plan(
    credential_args: &[String],
    rules: Option<&NetworkRules>,
    policy: &mut crate::policy::Policy,
) -> Result<Option<RunPlan>, EgressError> {
    let credentials = run_credentials(credential_args, rules)?;
    if rules.is_none() {
        return Ok(None);
    }
    let interception = Interception::prepare();
    policy.namespaces.files = interception.view_files();
    Ok(Some(RunPlan {
        credentials,
        interception,
    }))
}

impl RunPlan {
    /// The command's trust variables and credential placeholders as they will be when the
    /// view shows the CA's files where the plan asks: its environment is handed to its init
    /// before the proxy starts (exec/one.rs); [`RunEgress::child_env`] says what holds once
    /// the sandbox exists.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let dir = self.interception.view_files().map(|f| f.dir);
        self.interception
            .child_env(dir.as_deref())
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(self.credentials.child_env())
            .collect()
    }
}

/// `run`'s credentials (`--credential`), their values from our environment.
pub fn run_credentials(
    args: &[String],
    rules: Option<&NetworkRules>,
) -> Result<Credentials, EgressError> {
    if !args.is_empty() && rules.is_none() {
        return Err(EgressError::CredentialWithoutRules);
    }
    let creds = super::credential_flags::credentials(args, rules, &|k| std::env::var_os(k))?;
    // The values now live in the store's wipe-on-fork memory: our own environment block,
    // which every fork (the exec's init among them) copies, keeps none.
    for (name, _) in creds.describe() {
        egress::secret_mem::scrub_own_env(&name);
    }
    Ok(creds)
}

/// `run`'s proxy: started once the sandbox exists, counted into the report at the end.
pub struct RunEgress {
    proxy: ProxyHandle,
    /// The trust variables and credential placeholders of the command.
    env: Vec<(String, String)>,
}

impl RunEgress {
    /// The sandbox's proxy with `rules`, TLS interception and `credentials`; its events go to
    /// the log as `NET:*` and `HTTP:*` lines.
    pub fn start(
        sandbox: &Sandbox,
        rules: NetworkRules,
        plan: RunPlan,
    ) -> Result<RunEgress, RunError> {
        let RunPlan {
            credentials,
            interception,
        } = plan;
        let interception = &interception;
        let mut env: Vec<(String, String)> = interception
            .child_env(sandbox.view_files())
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        env.extend(credentials.child_env());
        let events: Arc<dyn EventSink> = Arc::new(egress::LogSink);
        let config = proxy_config(
            sandbox,
            interception,
            CredentialStore::new(credentials),
            events.clone(),
        );
        let proxy = start(sandbox, PolicyHandle::new(rules), events, config)?;
        Ok(RunEgress { proxy, env })
    }

    /// The connections allowed and denied so far (`run` has one exec: the sandbox's counts).
    pub fn counts(&self) -> Counts {
        self.proxy.counters().total()
    }

    /// The command's trust variables and credential placeholders.
    pub fn child_env(&self) -> &[(String, String)] {
        &self.env
    }
}

/// `check --egress HOST:PORT [--binary PATH]`: what the proxy would decide, without a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EgressAnswer {
    pub host: String,
    pub port: u16,
    pub binary: Option<String>,
    pub allowed: bool,
    /// The rule that allows (the smallest matching key).
    pub rule: Option<String>,
    /// Why not, as the 403's `reason` would say it.
    pub reason: Option<String>,
    /// Without `--binary`: the binaries of the rule whose endpoint matches.
    pub binaries: Vec<String>,
}

/// Parse `HOST:PORT` (or `[v6]:PORT`) for `check --egress`.
pub fn parse_target(arg: &str) -> Result<(String, u16), RunError> {
    let usage = |why: &str| RunError::Usage(format!("--egress {arg}: {why} (HOST:PORT)"));
    let (host, port) = arg.rsplit_once(':').ok_or_else(|| usage("no port"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(usage("the port must be a number from 1 to 65535")),
        Ok(p) => p,
    };
    if host.is_empty() {
        return Err(usage("the host is empty"));
    }
    Ok((host.to_string(), port))
}

/// The decision of [`egress::decide`] for `host:port` from `binary`, as the proxy makes it
/// before resolving (the address checks come at connect time). Without a binary: whether an
/// endpoint matches, and which binaries its rule admits.
pub fn answer(
    rules: Option<&NetworkRules>,
    host: &str,
    port: u16,
    binary: Option<&str>,
) -> EgressAnswer {
    let state = PolicyState::Rules(Arc::new(rules.cloned().unwrap_or_default()));
    let mut a = EgressAnswer {
        host: host.to_string(),
        port,
        binary: binary.map(str::to_string),
        allowed: false,
        rule: None,
        reason: None,
        binaries: Vec::new(),
    };
    let lower = host.to_ascii_lowercase();
    let endpoint_rule = rules.and_then(|r| {
        r.rules()
            .iter()
            .find(|rule| rule.endpoints.iter().any(|e| e.matches(&lower, port)))
    });
    match (binary, endpoint_rule) {
        (None, Some(rule)) if !rule.binaries.is_empty() => {
            a.allowed = true;
            a.rule = Some(rule.key.clone());
            a.binaries = rule
                .binaries
                .iter()
                .map(|b| b.as_str().to_string())
                .collect();
        }
        _ => {
            let caller = Caller {
                pid: 0,
                exe: binary.unwrap_or("").to_string(),
                ancestors: Vec::new(),
                cmdline_paths: Vec::new(),
                exec: ExecKey(0),
                ..Default::default()
            };
            match egress::decide(&state, host, port, &caller) {
                Decision::Allow(al) => {
                    a.allowed = true;
                    a.rule = Some(al.rule);
                }
                Decision::Deny(d) => a.reason = Some(d.reason),
            }
        }
    }
    a
}

/// One line per rule for `check --explain`: `key: host:ports, ... <- binaries`.
pub fn describe(rules: &NetworkRules) -> Vec<String> {
    rules
        .rules()
        .iter()
        .map(|r| {
            let eps: Vec<String> = r
                .endpoints
                .iter()
                .map(|e| {
                    let host = e.host.as_ref().map_or("*", |h| h.as_str());
                    let ports: Vec<String> = e.ports.iter().map(u16::to_string).collect();
                    let mut s = format!("{host}:{}", ports.join(","));
                    if !e.allowed_ips.is_empty() {
                        let ips: Vec<String> =
                            e.allowed_ips.iter().map(|n| n.to_string()).collect();
                        s.push_str(&format!(" (allowed_ips {})", ips.join(",")));
                    }
                    if e.protocol.is_l7() {
                        s.push_str(&format!(" [{}]", e.protocol.as_str()));
                    }
                    s
                })
                .collect();
            let bins: Vec<&str> = r.binaries.iter().map(|b| b.as_str()).collect();
            let bins = if bins.is_empty() {
                "no binaries: matches nothing".to_string()
            } else {
                bins.join(", ")
            };
            format!("{}: {} <- {bins}", r.key, eps.join("; "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_net_forms() {
        let a = AllowNet::parse("pypi.org").unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.binary.as_str()),
            ("pypi.org", 443, "/**")
        );
        let a = AllowNet::parse("pkgs.test:8080,/usr/bin/python3").unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.binary.as_str()),
            ("pkgs.test", 8080, "/usr/bin/python3")
        );
        let a = AllowNet::parse("[2001:db8::1]:80").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("2001:db8::1", 80));
        for bad in ["", ":80", "h:0", "h:x", "h:70000", "h,", "::1:80", "[::1"] {
            let e = AllowNet::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--allow-net {bad}: ")), "{e}");
        }
    }

    #[test]
    fn allow_net_rules_are_validated_and_match_any_binary_by_default() {
        let e = network_rules(None, &["*.com".into()])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--allow-net *.com: "), "{e}");
        let e = network_rules(None, &["h.test,bin".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not absolute"), "{e}");
        assert!(network_rules(None, &[]).unwrap().is_none());
        let r = network_rules(None, &["pkgs.test:8080".into()])
            .unwrap()
            .unwrap();
        let ok = answer(Some(&r), "PKGS.test", 8080, Some("/usr/bin/python3.13"));
        assert!(
            ok.allowed && ok.rule.as_deref() == Some("allow-net-1"),
            "{ok:?}"
        );
        let no = answer(Some(&r), "pkgs.test", 443, Some("/usr/bin/curl"));
        assert!(!no.allowed);
        assert_eq!(
            no.reason.as_deref(),
            Some("endpoint pkgs.test:443 is not allowed by any policy")
        );
    }

    #[test]
    fn answer_without_a_binary_names_the_rules_binaries() {
        let file = crate::policy::openshell::from_yaml(
            "version: 1\nnetwork_policies:\n  web:\n    endpoints: [{host: a.test, port: 80}]\n    binaries: [{path: /usr/bin/curl}]\n",
        )
        .unwrap();
        let r = network_rules(Some(&file.network_policies), &[])
            .unwrap()
            .unwrap();
        let a = answer(Some(&r), "a.test", 80, None);
        assert!(a.allowed);
        assert_eq!(a.binaries, ["/usr/bin/curl"]);
        let d = answer(Some(&r), "a.test", 80, Some("/usr/bin/wget"));
        assert!(!d.allowed);
        assert!(
            d.reason
                .as_deref()
                .unwrap()
                .starts_with("binary '/usr/bin/wget' not allowed"),
            "{d:?}"
        );
        let none = answer(None, "a.test", 80, None);
        assert_eq!(
            none.reason.as_deref(),
            Some("network connections not allowed by policy")
        );
        assert_eq!(describe(&r), ["web: a.test:80 <- /usr/bin/curl"]);
    }
}
