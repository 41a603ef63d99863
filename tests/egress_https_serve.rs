//! `serve` with HTTPS egress as OpenShell users set it up, through the real binary: the test
//! gateway hands a `protocol: rest` policy revision and a provider environment whose secret
//! is bound to one endpoint. The main process and every exec get the CA's trust variables and
//! the placeholder; the proxy intercepts TLS, applies the REST rules, puts the real value
//! only into requests to the bound endpoint, and takes a refreshed value at the next
//! provider revision. The value is never in the sandbox, our log or the gateway's log stream.
//!
//! The supervisor and the gateway run in the test-made outer namespace (tests/support/egress);
//! the supervisor has a mount namespace of its own whose `/etc/hosts` is the test's hosts file
//! and whose system bundle holds the tests' upstream CA.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openshell_sandbox::policy::openshell::{
    CredentialBinding, NetworkBinary, NetworkEndpoint, NetworkPolicyRule, SandboxPolicy,
};
use openshell_sandbox::proto::v1::{
    PolicyStatus, StaticCredentialBinding, StaticCredentialEndpointBinding,
};
use support::egress::l7_servers::L7Upstream;
use support::plane::{SANDBOX_NAME, base_policy};
use support::skip::have;
use support::{AuthMode, SupOpts, Supervisor, TestGateway, gateway};

const SECRET: &str = "rg-SERVE-REAL-41f0c2";
const SECRET2: &str = "rg-SERVE-ROTATED-77aa01";
const SECRET3: &str = "rg-SERVE-THIRD-0c9e55";

fn endpoint(host: &str, port: u16) -> NetworkEndpoint {
    NetworkEndpoint {
        host: host.into(),
        port,
        ..Default::default()
    }
}

fn policy() -> SandboxPolicy {
    let curl = vec![NetworkBinary {
        path: "/usr/bin/curl".into(),
        ..Default::default()
    }];
    let rest = NetworkEndpoint {
        protocol: "rest".into(),
        access: "read-only".into(),
        enforcement: "enforce".into(),
        ..endpoint("secure-api.test", 9443)
    };
    SandboxPolicy {
        network_policies: [
            (
                "api_ro".to_string(),
                NetworkPolicyRule {
                    name: String::new(),
                    endpoints: vec![rest],
                    binaries: curl.clone(),
                },
            ),
            (
                "tls".to_string(),
                NetworkPolicyRule {
                    name: String::new(),
                    endpoints: vec![endpoint("cred.test", 9443), endpoint("secure.test", 9443)],
                    binaries: curl,
                },
            ),
        ]
        .into_iter()
        .collect(),
        ..base_policy(&[])
    }
}

fn provider_env(value: &str, revision: u64) -> gateway::ProviderEnv {
    provider_env_of(
        &[("RG_TOKEN", value, &[("cred.test", 9443)], "p")],
        revision,
    )
}

/// One provider secret: key, value, its profile's endpoints, its provider's name.
type ProviderSecret<'a> = (&'a str, &'a str, &'a [(&'a str, u32)], &'a str);

/// A provider environment of `secrets` and one non-secret key.
fn provider_env_of(secrets: &[ProviderSecret<'_>], revision: u64) -> gateway::ProviderEnv {
    let mut environment: std::collections::HashMap<String, String> = secrets
        .iter()
        .map(|(k, v, _, _)| (k.to_string(), v.to_string()))
        .collect();
    environment.insert("MODEL_URL".into(), "https://model.test/v1".into());
    gateway::ProviderEnv {
        environment,
        non_secret: vec!["MODEL_URL".into()],
        static_keys: secrets.iter().map(|(k, ..)| k.to_string()).collect(),
        bindings: secrets
            .iter()
            .map(|(k, _, to, provider)| {
                (
                    k.to_string(),
                    StaticCredentialBinding {
                        endpoints: to
                            .iter()
                            .map(|(host, port)| StaticCredentialEndpointBinding {
                                host: host.to_string(),
                                port: *port,
                                path: String::new(),
                            })
                            .collect(),
                        credential_identity: provider.to_string(),
                        workload_credential_handle: String::new(),
                    },
                )
            })
            .collect(),
        revision,
    }
}

fn wrapper(binds: &[(&Path, &str)]) -> Vec<String> {
    let mounts: Vec<String> = binds
        .iter()
        .map(|(s, d)| format!("mount --bind {} {d}", s.display()))
        .collect();
    vec![
        "unshare".into(),
        "-m".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!("{} && exec \"$0\" \"$@\"", mounts.join(" && ")),
    ]
}

/// The egress world of these tests with the TLS upstream started: the world, its hosts file,
/// the upstream, and a system bundle that trusts the upstream's CA.
fn with_upstream<R: Send + 'static>(
    f: impl FnOnce(&mut support::egress::World, PathBuf, std::sync::Arc<L7Upstream>, PathBuf) -> R
    + Send
    + 'static,
) -> R {
    support::egress::World::run(|w| {
        let hosts = w.hosts.clone();
        let up = w.rt.block_on(L7Upstream::start());
        let bundle = support::egress::bundle_with(w.tmp.path(), &up.ca_pem);
        f(w, hosts, up, bundle)
    })
}

/// The test gateway with [`policy`] and the provider's [`SECRET`], and a supervisor started
/// with `opts` and ready.
async fn started(opts: SupOpts) -> (TestGateway, Supervisor) {
    let gw = TestGateway::start(AuthMode::Jwt).await;
    gw.state.set_policy(&policy()).unwrap();
    *gw.state.provider_env.lock().unwrap() = provider_env(SECRET, 1);
    let mut sup = Supervisor::start(&gw, opts);
    gw.wait_ready(&mut sup).await;
    (gw, sup)
}

/// The supervisor of these tests: the test gateway's sandbox, no local policy file, the
/// world's /etc/hosts and a system bundle that trusts the upstream's CA, `args` as the main
/// process; `poll`: the policy is polled every second.
fn sup_opts(hosts: &Path, bundle: &Path, poll: bool, args: &[&str]) -> SupOpts {
    let mut env = vec![("OPENSHELL_SANDBOX".into(), SANDBOX_NAME.into())];
    if poll {
        env.push(("OPENSHELL_POLICY_POLL_INTERVAL_SECS".into(), "1".into()));
    }
    env.push((
        "OPENSHELL_LOCAL_POLICY_PATH".into(),
        "/nonexistent/openshell/policy.yaml".into(),
    ));
    SupOpts {
        env,
        wrapper: wrapper(&[
            (hosts, "/etc/hosts"),
            (bundle, support::egress::SYSTEM_BUNDLE),
        ]),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn serve_intercepts_applies_rest_rules_and_keeps_provider_credentials_in_the_proxy() {
    if !support::egress::require() || !have("curl") || !have("unshare") {
        return;
    }
    with_upstream(|w, hosts, up, bundle| {
        w.rt.block_on(async move {
            // The main process records the environment it was started with.
            let (gw, sup) = started(sup_opts(&hosts, &bundle, true, &["sh", "-c", "env > main.env.tmp && mv main.env.tmp main.env; exec sleep 600"])).await;
            let v = gw.state.current_revision().unwrap().version;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !gw
                .state
                .policy_reports()
                .iter()
                .any(|r| r.version == v && r.status == PolicyStatus::Loaded as i32)
            {
                assert!(Instant::now() < deadline, "not LOADED:\n{}", sup.log());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }

            // The main process: the placeholder and the trust variables, from the start.
            let path = sup.workdir.join("main.env");
            let deadline = Instant::now() + Duration::from_secs(30);
            while !path.exists() {
                assert!(Instant::now() < deadline, "no main.env:\n{}", sup.log());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let main_env = std::fs::read_to_string(&path).unwrap();
            for want in [
                "RG_TOKEN=openshell:resolve:env:RG_TOKEN",
                "MODEL_URL=https://model.test/v1",
                "SSL_CERT_FILE=/etc/openshell-tls/ca-bundle.pem",
                "NODE_EXTRA_CA_CERTS=/etc/openshell-tls/openshell-ca.pem",
                "HTTPS_PROXY=http://10.200.0.1:3128",
            ] {
                assert!(main_env.lines().any(|l| l == want), "{want}:\n{main_env}");
            }
            assert!(!main_env.contains(SECRET));

            let script = r#"
env | grep -E '^(RG_TOKEN|SSL_CERT_FILE)=' | sort
ls -A /etc/openshell-tls | tr '\n' ' '; echo
curl -sS --max-time 20 https://secure-api.test:9443/ok; echo
curl -sS --max-time 20 -o /dev/null -w '%{http_code}\n' -X POST https://secure-api.test:9443/no
curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" https://cred.test:9443/quiet/use; echo
curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" https://secure.test:9443/steal; echo
cat /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -c rg-SERVE || true
"#;
            let r = gw.sh(script).await;
            let out = r.out();
            let lines: Vec<&str> = out.lines().collect();
            assert!(lines.len() >= 8, "{r:?}\n{}", sup.log());
            assert_eq!(lines[0], "RG_TOKEN=openshell:resolve:env:RG_TOKEN", "{out}");
            assert_eq!(lines[1], "SSL_CERT_FILE=/etc/openshell-tls/ca-bundle.pem", "{out}");
            assert_eq!(lines[2], "ca-bundle.pem openshell-ca.pem ", "{out}");
            let ok: serde_json::Value =
                serde_json::from_str(lines[3]).unwrap_or_else(|e| panic!("{e}: {out}"));
            assert_eq!(ok["request"], "GET /ok HTTP/1.1");
            assert_eq!(lines[4], "403", "read-only refuses POST: {out}");
            assert_eq!(lines[5], "quiet ok", "{out}");
            let steal: serde_json::Value = serde_json::from_str(lines[6]).unwrap();
            assert_eq!(steal["error"], "credential_endpoint_mismatch", "{out}");
            assert_eq!(lines[7], "0", "{out}");
            assert!(!out.contains(SECRET));
            // The upstream: the value at the bound endpoint, nothing at the other.
            assert_eq!(
                up.requests(),
                ["GET /ok HTTP/1.1", "GET /quiet/use HTTP/1.1"],
                "{out}"
            );
            let heads = up.heads().concat();
            assert!(heads.contains(&format!("authorization: Bearer {SECRET}")), "{heads}");
            assert!(!heads.contains("openshell:resolve"));

            // A provider refresh: the next request carries the new value.
            *gw.state.provider_env.lock().unwrap() = provider_env(SECRET2, 2);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let r = gw
                    .sh(r#"curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" https://cred.test:9443/quiet/again"#)
                    .await;
                assert_eq!(r.out().trim(), "quiet ok", "{r:?}");
                if up.heads().concat().contains(SECRET2) {
                    break;
                }
                assert!(Instant::now() < deadline, "no refresh:\n{}", sup.log());
                tokio::time::sleep(Duration::from_millis(300)).await;
            }

            // The gateway's log stream has the HTTP Activity events, and no value anywhere.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let lines = gw.state.log_lines();
                let http: Vec<&str> = lines
                    .iter()
                    .map(|l| l.message.as_str())
                    .filter(|m| m.starts_with("HTTP:"))
                    .collect();
                let found = http.iter().any(|m| {
                    m.starts_with("HTTP:POST [MED] DENIED /usr/bin/curl(")
                        && m.contains("engine:l7")
                        && m.contains("POST /no not permitted by policy")
                }) && http
                    .iter()
                    .any(|m| m.starts_with("HTTP:GET [INFO] ALLOWED /usr/bin/curl(") && m.contains("secure-api.test:9443/ok"))
                    && http.iter().any(|m| m.contains("/quiet/use") && m.contains("credentials_injected=true"));
                if found {
                    let all: String = lines.iter().map(|l| format!("{l:?}")).collect();
                    assert!(!all.contains(SECRET) && !all.contains(SECRET2));
                    break;
                }
                assert!(Instant::now() < deadline, "HTTP events in the log push: {http:#?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let log = sup.log();
            assert!(!log.contains(SECRET) && !log.contains(SECRET2), "{log}");
            drop(sup);
        });
    });
}

/// Wait until the supervisor reports revision `v` LOADED.
async fn wait_loaded(gw: &TestGateway, sup: &Supervisor, v: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !gw
        .state
        .policy_reports()
        .iter()
        .any(|r| r.version == v && r.status == PolicyStatus::Loaded as i32)
    {
        assert!(Instant::now() < deadline, "{v} not LOADED:\n{}", sup.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `p` whose `secure.test` endpoint binds provider `provider`'s credentials (or none).
fn policy_binding(mut p: SandboxPolicy, provider: Option<&str>) -> SandboxPolicy {
    let tls = p.network_policies.get_mut("tls").unwrap();
    tls.endpoints[1].credential_binding =
        provider.map(|n| CredentialBinding { provider: n.into() });
    p
}

/// A policy endpoint's `credential_binding: {provider: NAME}` binds the values of provider
/// NAME whose profile names no endpoint, in `serve` too; each policy revision's bindings apply
/// from the next request (one removed: 403 credential_endpoint_mismatch and nothing reaches
/// the upstream; added back: the value is put in), and so does a provider refresh. A profile
/// that names its endpoints stays its values' only boundary.
#[test]
fn serve_binds_credentials_where_the_policy_revision_says() {
    if !support::egress::require() || !have("curl") || !have("unshare") {
        return;
    }
    with_upstream(|w, hosts, up, bundle| {
        w.rt.block_on(async move {
            let gw = TestGateway::start(AuthMode::Jwt).await;
            gw.state
                .set_policy(&policy_binding(policy(), Some("rgprov")))
                .unwrap();
            // RG_TOKEN: an endpointless profile of provider rgprov; RG_PINNED: the same
            // provider's value, its profile bound to cred.test only.
            let env = |token: &str, rev| {
                provider_env_of(
                    &[
                        ("RG_TOKEN", token, &[], "rgprov"),
                        ("RG_PINNED", SECRET2, &[("cred.test", 9443)], "rgprov"),
                    ],
                    rev,
                )
            };
            *gw.state.provider_env.lock().unwrap() = env(SECRET, 1);
            let opts = sup_opts(&hosts, &bundle, true, &["sleep", "600"]);
            let mut sup = Supervisor::start(&gw, opts);
            gw.wait_ready(&mut sup).await;
            // The supervisor's baseline paths make a revision of their own at start.
            let first = gw.state.current_revision().unwrap();
            let (v1, base) = (first.version, first.policy);
            wait_loaded(&gw, &sup, v1).await;

            // One request; prints the status, then the body.
            let get = |var: &'static str, url: &'static str| {
                format!(
                    r#"curl -sS --max-time 20 -o body -w '%{{http_code}}\n' -H "Authorization: Bearer ${var}" {url}; cat body"#
                )
            };
            let r = gw.sh(&get("RG_TOKEN", "https://secure.test:9443/quiet/bound")).await;
            assert_eq!(r.out(), "200\nquiet ok", "{r:?}\n{}", sup.log());
            let heads = up.heads().concat();
            assert!(heads.contains(&format!("authorization: Bearer {SECRET}")), "{heads}");
            // Not where no binding names it: the profile has no endpoint.
            let r = gw.sh(&get("RG_TOKEN", "https://cred.test:9443/quiet/nowhere")).await;
            let (status, body) = r.out().split_once('\n').map(|(a, b)| (a.to_string(), b.to_string())).unwrap();
            assert_eq!(status, "403", "{r:?}");
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(body["error"], "credential_endpoint_mismatch", "{r:?}");
            // The pinned value of the same provider is not widened by the policy.
            let r = gw.sh(&get("RG_PINNED", "https://secure.test:9443/quiet/widened")).await;
            assert!(r.out().starts_with("403\n") && r.out().contains("credential_endpoint_mismatch"), "{r:?}");
            let r = gw.sh(&get("RG_PINNED", "https://cred.test:9443/quiet/pinned")).await;
            assert_eq!(r.out(), "200\nquiet ok", "{r:?}");

            // A revision without the binding: the next request is refused before the upstream.
            let v2 = gw.state.set_policy(&policy_binding(base.clone(), None)).unwrap();
            wait_loaded(&gw, &sup, v2).await;
            let r = gw.sh(&get("RG_TOKEN", "https://secure.test:9443/quiet/unbound")).await;
            assert!(r.out().starts_with("403\n") && r.out().contains("credential_endpoint_mismatch"), "{r:?}\n{}", sup.log());

            // Bound again: the value is put in again.
            let v3 = gw
                .state
                .set_policy(&policy_binding(base, Some("rgprov")))
                .unwrap();
            assert!(v3 > v2);
            wait_loaded(&gw, &sup, v3).await;
            let r = gw.sh(&get("RG_TOKEN", "https://secure.test:9443/quiet/rebound")).await;
            assert_eq!(r.out(), "200\nquiet ok", "{r:?}\n{}", sup.log());

            // A provider refresh keeps the policy's binding, with the new value.
            *gw.state.provider_env.lock().unwrap() = env(SECRET3, 2);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let r = gw.sh(&get("RG_TOKEN", "https://secure.test:9443/quiet/refreshed")).await;
                assert_eq!(r.out(), "200\nquiet ok", "{r:?}");
                if up.heads().concat().contains(SECRET3) {
                    break;
                }
                assert!(Instant::now() < deadline, "no refresh:\n{}", sup.log());
                tokio::time::sleep(Duration::from_millis(300)).await;
            }

            let reqs = up.requests();
            assert_eq!(
                reqs.iter().filter(|r| !r.starts_with("GET /quiet/refreshed")).cloned().collect::<Vec<_>>(),
                ["GET /quiet/bound HTTP/1.1", "GET /quiet/pinned HTTP/1.1", "GET /quiet/rebound HTTP/1.1"],
                "refused requests reached the upstream"
            );
            for (line, h) in reqs.iter().zip(up.heads()) {
                if line.contains("/quiet/pinned") {
                    assert!(h.contains(&format!("authorization: Bearer {SECRET2}")), "{h}");
                } else {
                    assert!(!h.contains(SECRET2), "{line}: {h}");
                }
                assert!(!h.contains("openshell:resolve"), "{line}: {h}");
            }
            drop(sup);
        });
    });
}

/// The provider's value is in the memory of no process below the supervisor (the sandboxed
/// code, and the inits of the main process and of each exec: root forks of the supervisor),
/// after requests carrying it went through the proxy and a later exec was started.
#[test]
fn serve_provider_credentials_are_in_no_memory_below_the_supervisor() {
    if !support::egress::require() || !have("curl") || !have("unshare") {
        return;
    }
    with_upstream(|w, hosts, up, bundle| {
        w.rt.block_on(async move {
            let (gw, sup) = started(sup_opts(&hosts, &bundle, false, &["sleep", "600"])).await;
            let use_it = r#"curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" https://cred.test:9443/quiet/mem"#;
            let r = gw.sh(use_it).await;
            assert_eq!(r.out(), "quiet ok", "{r:?}\n{}", sup.log());
            // A later exec, forked after the value went through the proxy, stays running.
            let ready = sup.workdir.join("ready");
            let script = format!("{use_it}; touch {}; exec sleep 60", ready.display());
            let later = tokio::spawn(support::exec::exec_collect(
                gw.state.clone(),
                gw.request(&["sh", "-c", &script]),
            ));
            let deadline = Instant::now() + Duration::from_secs(30);
            while !ready.exists() {
                assert!(Instant::now() < deadline, "the exec never got ready:\n{}", sup.log());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let heads = up.heads().concat();
            assert_eq!(heads.matches(&format!("authorization: Bearer {SECRET}")).count(), 2, "{heads}");
            let found = support::egress::memory::below_holding(sup.pid(), SECRET.as_bytes());
            let (mut sandboxed, mut roots) = (0, 0);
            for (pid, uid, hits) in &found {
                if uid == "0" {
                    roots += 1;
                } else {
                    sandboxed += 1;
                }
                assert!(hits.is_empty(), "PID {pid} (uid {uid}) holds the value: {hits:?}");
            }
            assert!(sandboxed >= 2 && roots >= 2, "{found:?}");
            later.abort();
            drop(sup);
        });
    });
}

/// The helper that builds a new revision's view (a root fork of the supervisor, made after
/// the provider's value went through the proxy) holds no copy of the value while it waits for
/// the supervisor to take its namespaces: it drops the supervisor's memory once it has
/// reported. The supervisor is held at `view-reported` so the helper is alive when it is read.
#[test]
fn a_new_revisions_view_helper_holds_no_copy_of_the_provider_value() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    if !support::egress::require() || !have("curl") || !have("unshare") {
        return;
    }
    with_upstream(|w, hosts, up, bundle| {
        let pause = w.tmp.path().join("pause");
        std::fs::create_dir(&pause).unwrap();
        let (reached, go) = (
            pause.join("view-reported.reached"),
            pause.join("view-reported.go"),
        );
        // Every view made until `hold` is set goes on at once (the first revisions').
        let hold = Arc::new(AtomicBool::new(false));
        let releaser = {
            let (hold, reached, go) = (hold.clone(), reached.clone(), go.clone());
            std::thread::spawn(move || {
                while !hold.load(Ordering::SeqCst) {
                    if reached.exists() {
                        std::fs::write(&go, "").unwrap();
                        while reached.exists() {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        w.rt.block_on(async move {
            let mut opts = sup_opts(&hosts, &bundle, true, &["sleep", "600"]);
            opts.env.push(("OSB_PAUSE_AT".into(), "view-reported".into()));
            opts.env.push(("OSB_PAUSE_DIR".into(), pause.display().to_string()));
            let (gw, sup) = started(opts).await;
            let first = gw.state.current_revision().unwrap();
            wait_loaded(&gw, &sup, first.version).await;
            let use_it = r#"curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" https://cred.test:9443/quiet/helper"#;
            let r = gw.sh(use_it).await;
            assert_eq!(r.out(), "quiet ok", "{r:?}\n{}", sup.log());
            let heads = up.heads().concat();
            assert!(heads.contains(&format!("authorization: Bearer {SECRET}")), "{heads}");

            hold.store(true, Ordering::SeqCst);
            releaser.join().unwrap();
            let before = support::egress::memory::descendants(sup.pid());
            let mut next = first.policy.clone();
            let tls = next.network_policies.get_mut("tls").unwrap();
            tls.endpoints.push(endpoint("later.test", 9443));
            let v2 = gw.state.set_policy(&next).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !reached.exists() {
                assert!(Instant::now() < deadline, "no view was made for {v2}:\n{}", sup.log());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The helper: PID 1 of a namespace of its own, new since the revision.
            let helpers: Vec<u32> = support::egress::memory::descendants(sup.pid())
                .into_iter()
                .filter(|p| !before.contains(p))
                .filter(|p| {
                    let st = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
                    st.lines().any(|l| l.starts_with("NSpid:") && l.trim_end().ends_with("\t1"))
                })
                .collect();
            assert_eq!(helpers.len(), 1, "{helpers:?}: {before:?}");
            let hits = support::egress::memory::memory_holding(helpers[0], SECRET.as_bytes());
            std::fs::write(&go, "").unwrap();
            assert!(hits.is_empty(), "the view helper {} holds the value: {hits:?}", helpers[0]);
            wait_loaded(&gw, &sup, v2).await;
            let r = gw.sh(use_it).await;
            assert_eq!(r.out(), "quiet ok", "{r:?}\n{}", sup.log());
            drop(sup);
        });
    });
}

/// An SSH session of `serve` (OpenSSH through the relay, as `openshell sandbox connect` does)
/// gets the CA's trust variables and the placeholder, and its curl reaches an HTTPS upstream
/// through the interception: trusting the sandbox CA by those variables alone, with the value
/// put in at the bound endpoint only.
#[test]
fn an_ssh_session_trusts_the_sandbox_ca_and_reaches_https_through_the_interception() {
    if !support::egress::require() || !have("curl") || !have("unshare") {
        return;
    }
    if !support::ssh_bridge::have_openssh() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("ssh, sftp and busybox are required (CI=true turns this skip into a failure)");
        }
        eprintln!("SKIPPED: OpenSSH client or busybox absent");
        return;
    }
    with_upstream(|w, hosts, up, bundle| {
        w.rt.block_on(async move {
            let (gw, sup) = started(sup_opts(&hosts, &bundle, false, &["sleep", "600"])).await;
            let bridge = support::ssh_bridge::SshBridge::start(gw.state.clone()).await;
            // Only the session's variables say where the CA is: curl's own default bundle is
            // the system one, which does not hold the sandbox CA.
            let script = r#"env | grep -E '^(SSL_CERT_FILE|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|NODE_EXTRA_CA_CERTS|GIT_SSL_CAINFO|HTTPS_PROXY|RG_TOKEN)=' | sort
curl -sS --max-time 20 https://secure.test:9443/ssh; echo
curl -sS --max-time 20 -H "Authorization: Bearer $RG_TOKEN" https://cred.test:9443/quiet/ssh; echo
env -u CURL_CA_BUNDLE -u SSL_CERT_FILE curl -sS --max-time 20 -o /dev/null -w '%{http_code}\n' --cacert /dev/null https://secure.test:9443/untrusted 2>&1 | tail -1"#;
            let mut c = bridge.command("ssh");
            c.arg("sandbox").arg(script);
            let out = tokio::task::spawn_blocking(move || c.output().unwrap())
                .await
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success() || !stdout.is_empty(), "{stdout}\n{stderr}\n{}", sup.log());
            let lines: Vec<&str> = stdout.lines().collect();
            assert!(lines.len() >= 10, "{stdout}\n{stderr}\n{}", sup.log());
            assert_eq!(
                lines[..7],
                [
                    "CURL_CA_BUNDLE=/etc/openshell-tls/ca-bundle.pem",
                    "GIT_SSL_CAINFO=/etc/openshell-tls/ca-bundle.pem",
                    "HTTPS_PROXY=http://10.200.0.1:3128",
                    "NODE_EXTRA_CA_CERTS=/etc/openshell-tls/openshell-ca.pem",
                    "REQUESTS_CA_BUNDLE=/etc/openshell-tls/ca-bundle.pem",
                    "RG_TOKEN=openshell:resolve:env:RG_TOKEN",
                    "SSL_CERT_FILE=/etc/openshell-tls/ca-bundle.pem",
                ],
                "{stdout}"
            );
            let echo: serde_json::Value =
                serde_json::from_str(lines[7]).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
            assert_eq!(echo["request"], "GET /ssh HTTP/1.1", "{stdout}");
            assert_eq!(lines[8], "quiet ok", "{stdout}");
            // Without the CA, the interception's certificate is refused by the client: the
            // session's trust comes from the variables.
            assert_eq!(lines[9], "000", "{stdout}\n{stderr}");
            assert!(!stdout.contains(SECRET));
            let reqs = up.requests();
            assert_eq!(reqs, ["GET /ssh HTTP/1.1", "GET /quiet/ssh HTTP/1.1"], "{stdout}");
            let heads = up.heads();
            assert!(heads[1].contains(&format!("authorization: Bearer {SECRET}")), "{heads:?}");
            assert!(!heads[0].contains(SECRET), "{heads:?}");
            drop(bridge);
            drop(sup);
        });
    });
}
