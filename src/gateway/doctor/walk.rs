//! The walk along the dial-back path: each step in the supervisor's order, the first failure
//! named and the steps after it skipped; the main process checked on the side.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;

use crate::gateway::config::{GatewayConfig, TokenSource};
use crate::gateway::tokens::{TokenError, TokenStore};
use crate::gateway::{auth, channel, tls};
use crate::proto::sandbox::v1::{GetSandboxConfigRequest, GetSandboxConfigResponse};
use crate::proto::v1::{HealthRequest, ServiceStatus, open_shell_client::OpenShellClient};

use super::args::DoctorArgs;
use super::causes::{
    client_cert_refused, handshake_failure, jwt_claims, not_after, status_failure,
    tls_file_failure, token_failure,
};
use super::local::{Early, main_process_step, resolve};
use super::step::{Report, Status, Step};

/// The method path of the read-only, authenticated probe.
const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";

/// The dial-back steps, in the order the supervisor takes them.
const PATH_STEPS: [&str; 7] = ["endpoint", "dns", "tcp", "tls", "token", "health", "config"];

/// Walk every step and build the report.
pub async fn run(args: DoctorArgs) -> Report {
    let timeout = Duration::from_secs(args.step_timeout);
    let mut serve = args.serve;
    let (cfg, early) = resolve(&mut serve);
    let mut steps = Vec::new();
    let main_step = main_process_step(&serve, early.main.clone());
    match cfg {
        Err(step) => {
            let name = step.step;
            steps.push(step);
            skip_after(&mut steps, name);
        }
        Ok(cfg) => {
            let mut walk = Walk {
                cfg,
                early,
                timeout,
                steps: Vec::new(),
                channel: None,
                token: None,
            };
            walk.go().await;
            steps = walk.steps;
        }
    }
    steps.push(main_step);
    let first_failure = steps
        .iter()
        .find(|s| s.status == Status::Failed)
        .map(|s| s.step);
    Report {
        ok: first_failure.is_none(),
        first_failure,
        steps,
    }
}

fn skip_after(steps: &mut Vec<Step>, failed: &str) {
    let after = PATH_STEPS.iter().position(|s| *s == failed).unwrap_or(0) + 1;
    for s in &PATH_STEPS[after..] {
        steps.push(Step::skipped(s, format!("the {failed} step failed")));
    }
}

struct Walk {
    cfg: GatewayConfig,
    early: Early,
    timeout: Duration,
    steps: Vec<Step>,
    channel: Option<Channel>,
    token: Option<String>,
}

impl Walk {
    async fn go(&mut self) {
        let scheme = if self.cfg.tls.is_some() {
            "mTLS"
        } else {
            "plaintext h2c"
        };
        self.steps.push(Step::ok(
            "endpoint",
            format!(
                "{} ({scheme}), sandbox {}",
                self.cfg.endpoint, self.cfg.sandbox_id
            ),
        ));
        let addrs = match self.dns().await {
            Ok(a) => a,
            Err(s) => return self.fail(s),
        };
        let tcp = match self.tcp(&addrs).await {
            Ok(t) => t,
            Err(s) => return self.fail(s),
        };
        if let Err(s) = self.tls(tcp).await {
            return self.fail(s);
        }
        match self.token().await {
            Ok(s) => self.steps.push(s),
            Err(s) => return self.fail(s),
        }
        match self.health().await {
            Ok(s) => self.steps.push(s),
            Err(s) => return self.fail(s),
        }
        match self.config().await {
            Ok(s) => self.steps.push(s),
            Err(s) => self.fail(s),
        }
    }

    fn fail(&mut self, s: Step) {
        let name = s.step;
        self.steps.push(s);
        skip_after(&mut self.steps, name);
    }

    async fn dns(&mut self) -> Result<Vec<SocketAddr>, Step> {
        let (host, port) = (self.cfg.host.clone(), self.cfg.port);
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.steps
                .push(Step::ok("dns", format!("{ip} is an address; no lookup")));
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let fix = "check the Service name and namespace in OPENSHELL_ENDPOINT (`kubectl -n NAMESPACE get svc`; the form is SERVICE.NAMESPACE.svc.cluster.local) and the pod's DNS (/etc/resolv.conf, `kubectl -n kube-system get pods -l k8s-app=kube-dns`)".to_owned();
        let addrs: Vec<SocketAddr> = match tokio::time::timeout(
            self.timeout,
            tokio::net::lookup_host((host.as_str(), port)),
        )
        .await
        {
            Err(_) => {
                return Err(Step::failed(
                    "dns",
                    "dns-timeout",
                    format!("resolving `{host}` took over {:?}", self.timeout),
                    fix,
                ));
            }
            Ok(Err(e)) => {
                return Err(Step::failed(
                    "dns",
                    "dns-failed",
                    format!("`{host}` does not resolve: {e}"),
                    fix,
                ));
            }
            Ok(Ok(a)) => a.collect(),
        };
        if addrs.is_empty() {
            return Err(Step::failed(
                "dns",
                "dns-failed",
                format!("`{host}` resolves to no address"),
                fix,
            ));
        }
        let list: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
        if self.cfg.loopback_only && addrs.iter().any(|a| !a.ip().to_canonical().is_loopback()) {
            return Err(Step::failed(
                "dns",
                "not-loopback",
                format!(
                    "`{host}` -> {}: not only loopback addresses, so serve will not send the bearer token to it over plaintext",
                    list.join(", ")
                ),
                format!(
                    "make `{host}` resolve to 127.0.0.1 / ::1 only (/etc/hosts), use https://, or accept the risk with {}=1",
                    crate::gateway::config::ALLOW_PLAINTEXT_TOKEN
                ),
            ));
        }
        self.steps
            .push(Step::ok("dns", format!("{host} -> {}", list.join(", "))));
        Ok(addrs)
    }

    async fn tcp(&mut self, addrs: &[SocketAddr]) -> Result<TcpStream, Step> {
        let mut errors = Vec::new();
        let mut refused = false;
        for a in addrs {
            match tokio::time::timeout(self.timeout, TcpStream::connect(a)).await {
                Ok(Ok(s)) => {
                    self.steps
                        .push(Step::ok("tcp", format!("connected to {a}")));
                    return Ok(s);
                }
                Ok(Err(e)) => {
                    refused |= e.kind() == std::io::ErrorKind::ConnectionRefused;
                    errors.push(format!("{a}: {e}"));
                }
                Err(_) => errors.push(format!("{a}: no answer within {:?}", self.timeout)),
            }
        }
        let detail = errors.join("; ");
        Err(if refused {
            Step::failed(
                "tcp",
                "connection-refused",
                detail,
                "nothing listens there: is the gateway pod running and Ready, and is the port the Service's gRPC port (8080)? `kubectl -n NAMESPACE get pods,endpoints`",
            )
        } else {
            Step::failed(
                "tcp",
                "connect-failed",
                detail,
                "the address does not answer: a NetworkPolicy or firewall between the sandbox namespace and the gateway drops the traffic, or the Service has no endpoints",
            )
        })
    }

    async fn tls(&mut self, tcp: TcpStream) -> Result<(), Step> {
        if let Some(s) = self.early.tls.take() {
            return Err(s);
        }
        let Some(paths) = self.cfg.tls.clone() else {
            self.steps.push(Step::ok(
                "tls",
                "plaintext endpoint (http://): no TLS, and the gateway cannot tell this sandbox by its certificate",
            ));
            return Ok(());
        };
        let setup = tls::load(&paths, &self.cfg.host).map_err(tls_file_failure)?;
        let name = setup.server_name.to_str().into_owned();
        let mut stream = match tokio::time::timeout(
            self.timeout,
            setup.connector.connect(setup.server_name.clone(), tcp),
        )
        .await
        {
            Err(_) => {
                return Err(Step::failed(
                    "tls",
                    "tls-timeout",
                    format!("no TLS handshake within {:?}", self.timeout),
                    "the port may not speak TLS; for a plaintext gateway use http://",
                ));
            }
            Ok(Err(e)) => return Err(handshake_failure(&e, &name, &paths.ca)),
            Ok(Ok(s)) => s,
        };
        if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(Step::failed(
                "tls",
                "no-h2",
                "the server did not agree to HTTP/2 (ALPN h2)",
                "the endpoint is not the gateway's gRPC port, or a proxy in between terminates TLS",
            ));
        }
        // In TLS 1.3 the server checks our certificate after our side of the handshake is
        // done, so its refusal arrives as an alert on the first read. Send the HTTP/2 preface
        // and an empty SETTINGS frame; a gateway that accepted us answers with its SETTINGS.
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        let mut buf = [0u8; 64];
        let answer = tokio::time::timeout(self.timeout, async {
            stream.write_all(preface).await?;
            stream.flush().await?;
            stream.read(&mut buf).await
        })
        .await;
        match answer {
            Ok(Ok(n)) if n > 0 => {
                let peer = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first().map(|c| c.as_ref().to_vec()));
                let until = peer.and_then(|der| not_after(&der)).unwrap_or_default();
                self.steps.push(Step::ok(
                    "tls",
                    format!(
                        "handshake with `{name}` against {}, client certificate accepted{until}",
                        paths.ca.display()
                    ),
                ));
                Ok(())
            }
            Ok(Ok(_)) => Err(client_cert_refused(
                "the gateway closed the connection right after the handshake",
                &paths.cert,
            )),
            Ok(Err(e)) => Err(handshake_failure(&e, &name, &paths.ca)),
            Err(_) => Err(Step::failed(
                "tls",
                "no-h2-answer",
                format!(
                    "no HTTP/2 answer within {:?} after the handshake",
                    self.timeout
                ),
                "the endpoint is not the gateway's gRPC port",
            )),
        }
    }

    async fn channel(&mut self) -> Result<Channel, Step> {
        if let Some(c) = &self.channel {
            return Ok(c.clone());
        }
        match tokio::time::timeout(self.timeout, channel::connect(&self.cfg)).await {
            Ok(Ok(c)) => {
                self.channel = Some(c.clone());
                Ok(c)
            }
            Ok(Err(e)) => Err(Step::failed(
                "health",
                "h2-connect-failed",
                e.to_string(),
                "the TLS and TCP steps passed, so the HTTP/2 layer failed: is this the gateway's gRPC port?",
            )),
            Err(_) => Err(Step::failed(
                "health",
                "h2-connect-timeout",
                format!("no HTTP/2 connection within {:?}", self.timeout),
                "is this the gateway's gRPC port?",
            )),
        }
    }

    async fn token(&mut self) -> Result<Step, Step> {
        if let Some(s) = self.early.token.take() {
            return Err(s);
        }
        let source = self.cfg.token.clone();
        if source == TokenSource::None {
            return Ok(Step::ok(
                "token",
                "no token source: only the client certificate identifies this sandbox (enough for a v0.0.36 gateway; a v0.0.47+ gateway refuses ConnectSupervisor without one, see the config step)",
            ));
        }
        let var = source.variable();
        let store = TokenStore::new(source.clone());
        // The exchange needs a channel; the other sources read a value or a file.
        let ch = match &source {
            TokenSource::ServiceAccount(_) => Some(self.channel().await.map_err(|mut s| {
                s.step = "token";
                s
            })?),
            _ => None,
        };
        let got = match &ch {
            Some(c) => tokio::time::timeout(self.timeout, auth::ensure_token(&store, c))
                .await
                .unwrap_or_else(|_| {
                    Err(TokenError::Issue {
                        path: PathBuf::new(),
                        status: tonic::Status::deadline_exceeded("no answer"),
                    })
                }),
            None => {
                // Only the exchange uses the channel; the other sources get a lazy one that
                // is never dialed.
                let unused = Channel::from_static("http://[::1]:1").connect_lazy();
                auth::ensure_token(&store, &unused).await
            }
        };
        if let Err(e) = got {
            return Err(token_failure(e, var));
        }
        let token = store.get().unwrap_or_default();
        self.token = Some(token.clone());
        let how = match &source {
            TokenSource::ServiceAccount(p) => format!(
                "exchanged the service-account token from {} (IssueSandboxToken) for a gateway JWT",
                p.display()
            ),
            TokenSource::File(p) => format!("{var} {}", p.display()),
            _ => var.to_owned(),
        };
        let Some(claims) = jwt_claims(&token) else {
            return Ok(Step::ok(
                "token",
                format!("{how}: not a JWT; the gateway decides"),
            ));
        };
        let sub = claims
            .get("sandbox_id")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if !sub.is_empty() && sub != self.cfg.sandbox_id {
            return Err(Step::failed(
                "token",
                "token-sandbox-mismatch",
                format!(
                    "{how}: the token is for sandbox {sub}, but OPENSHELL_SANDBOX_ID is {}: the gateway refuses ConnectSupervisor with PERMISSION_DENIED",
                    self.cfg.sandbox_id
                ),
                "the token and the sandbox id must come from the same sandbox: recreate the pod from its Sandbox (the driver sets both), or fix the one set by hand",
            ));
        }
        let exp = claims.get("exp").and_then(|v| v.as_u64()).unwrap_or(0);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // The gateway allows 60 s of clock skew.
        if exp != 0 && exp + 60 < now {
            return Err(Step::failed(
                "token",
                "token-expired",
                format!("{how}: the JWT expired {} s ago", now - exp),
                match source {
                    TokenSource::ServiceAccount(_) => {
                        "the gateway minted an expired token: check the gateway's clock and server.sandboxJwt.ttlSecs"
                    }
                    _ => {
                        "give a fresh token (the file is re-read on UNAUTHENTICATED), or use the projected service-account token (OPENSHELL_K8S_SA_TOKEN_FILE)"
                    }
                },
            ));
        }
        let life = if exp == 0 {
            "never expires".to_owned()
        } else {
            format!("expires in {} s", exp.saturating_sub(now))
        };
        Ok(Step::ok(
            "token",
            format!("{how}: JWT for sandbox {sub}, {life}"),
        ))
    }

    async fn health(&mut self) -> Result<Step, Step> {
        let ch = self.channel().await?;
        // Health is unauthenticated: no bearer.
        let mut client = OpenShellClient::new(ch);
        match tokio::time::timeout(self.timeout, client.health(HealthRequest {})).await {
            Err(_) => Err(Step::failed(
                "health",
                "health-timeout",
                format!("no Health answer within {:?}", self.timeout),
                "the gateway is overloaded or stuck: `kubectl -n NAMESPACE logs deploy/openshell` (or the StatefulSet)",
            )),
            Ok(Err(status)) => Err(status_failure("health", "Health", &status, &self.cfg)),
            Ok(Ok(r)) => {
                let r = r.into_inner();
                let st = ServiceStatus::try_from(r.status).unwrap_or(ServiceStatus::Unspecified);
                if st == ServiceStatus::Healthy {
                    Ok(Step::ok(
                        "health",
                        format!("HEALTHY, version {}", r.version),
                    ))
                } else {
                    Err(Step::failed(
                        "health",
                        "gateway-unhealthy",
                        format!("the gateway says {}", st.as_str_name()),
                        "look at the gateway's logs and its database volume",
                    ))
                }
            }
        }
    }

    async fn config(&mut self) -> Result<Step, Step> {
        let ch = self.channel().await?;
        let mut grpc = tonic::client::Grpc::new(ch);
        let mut req = tonic::Request::new(GetSandboxConfigRequest {
            sandbox_id: self.cfg.sandbox_id.clone(),
        });
        if let Some(t) = &self.token {
            match tonic::metadata::MetadataValue::try_from(format!("Bearer {t}")) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    req.metadata_mut().insert("authorization", v);
                }
                Err(_) => {
                    return Err(Step::failed(
                        "config",
                        "token-not-header",
                        "the token holds characters an HTTP header cannot carry",
                        "the token file must hold only the JWT",
                    ));
                }
            }
        }
        let call = async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(channel::chain(&e)))?;
            grpc.unary::<_, GetSandboxConfigResponse, _>(
                req,
                http::uri::PathAndQuery::from_static(GET_SANDBOX_CONFIG),
                tonic_prost::ProstCodec::default(),
            )
            .await
        };
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(Step::failed(
                "config",
                "config-timeout",
                format!("no GetSandboxConfig answer within {:?}", self.timeout),
                "the gateway is overloaded or stuck: look at its logs",
            )),
            Ok(Err(status)) => Err(status_failure(
                "config",
                "GetSandboxConfig",
                &status,
                &self.cfg,
            )),
            Ok(Ok(r)) => {
                let r = r.into_inner();
                let policy = if r.policy.is_some() {
                    format!("policy version {}", r.version)
                } else {
                    "no policy configured".to_owned()
                };
                Ok(Step::ok(
                    "config",
                    format!(
                        "GetSandboxConfig as sandbox {}: {policy}",
                        self.cfg.sandbox_id
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_steps_follow_the_failure() {
        let mut v = vec![Step::failed("tcp", "x", "d", "f")];
        skip_after(&mut v, "tcp");
        let names: Vec<_> = v.iter().map(|s| s.step).collect();
        assert_eq!(names, ["tcp", "tls", "token", "health", "config"]);
        assert!(v[1..].iter().all(|s| s.status == Status::Skipped));
    }
}
