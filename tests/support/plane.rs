//! The gateway side of the policy plane and of log push, as the real
//! gateway plays it:
//!
//! - revisions: `set_policy` is what `openshell policy set` does. It enforces on a live
//!   sandbox with the same `check_live_change` the supervisor uses, so a test cannot exercise
//!   a change a real gateway refuses; an unchanged policy keeps its version.
//! - GetSandboxConfig answers raw bytes (served by path, see `gateway.rs`), so a revision can
//!   carry fields this build does not know, as a newer gateway's would.
//! - ReportPolicyStatus and UpdateConfig with the real gateway's sandbox-principal rules.
//! - PushSandboxLogs with the real gateway's rules: empty ids skipped, the first id checked,
//!   later ids must match, only the first 100 lines of a batch kept, a 2000-line tail.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use openshell_sandbox::policy::openshell::{
    FilesystemPolicy, LandlockPolicy, SandboxPolicy, check_live_change, encode_policy,
};
use openshell_sandbox::proto::sandbox::v1 as pb;
use openshell_sandbox::proto::v1::*;
use prost::Message;
use sha2::{Digest, Sha256};
use tonic::{Request, Status, Streaming};

use super::gateway::State;
use super::serve::{Supervisor, TestGateway};

/// The sandbox name the test gateway knows (`OPENSHELL_SANDBOX`).
pub const SANDBOX_NAME: &str = "plane-test-sandbox";

/// One policy revision.
#[derive(Clone, Debug)]
pub struct Revision {
    pub version: u32,
    pub policy: SandboxPolicy,
    /// Raw protobuf appended to the encoded policy: fields a newer gateway would send.
    pub extra: Vec<u8>,
    pub hash: String,
}

#[derive(Default, Debug)]
pub struct PlaneState {
    /// Every revision, oldest first; the last is current. Empty: no policy configured.
    pub revisions: Vec<Revision>,
    /// `policy_validation_failure_mode` (field 11); empty means fail_closed.
    pub failure_mode: String,
    /// policy status per version, as `GetSandboxPolicyStatus` would show it.
    pub status: BTreeMap<u32, i32>,
    pub reports: Vec<ReportPolicyStatusRequest>,
    pub updates: Vec<UpdateConfigRequest>,
    pub config_calls: u32,
    /// Answer this many GetSandboxConfig calls with this code.
    pub fail_config: u32,
    pub fail_code: Option<tonic::Code>,
}

#[derive(Default, Debug)]
pub struct LogState {
    /// The stored tail (2000 lines).
    pub lines: VecDeque<SandboxLogLine>,
    /// Line count of every batch as received (before the 100-line cut).
    pub batch_sizes: Vec<usize>,
    /// When each batch arrived.
    pub batch_times: Vec<Instant>,
    /// PushSandboxLogs calls.
    pub calls: u32,
    /// Refuse every PushSandboxLogs call with UNAUTHENTICATED.
    pub unauthenticated: bool,
}

const TAIL: usize = 2000;
const KEPT_PER_BATCH: usize = 100;

fn hash(policy: &SandboxPolicy, extra: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(encode_policy(policy));
    h.update(extra);
    hex::encode(h.finalize())
}

impl State {
    /// `openshell policy set`: a new revision, INVALID_ARGUMENT when forbids the change.
    /// The same policy again keeps its version ("Policy unchanged").
    pub fn set_policy(&self, policy: &SandboxPolicy) -> Result<u32, Status> {
        self.set_policy_with(policy, Vec::new())
    }

    /// As [`set_policy`](Self::set_policy), with raw protobuf appended to the policy message.
    pub fn set_policy_with(&self, policy: &SandboxPolicy, extra: Vec<u8>) -> Result<u32, Status> {
        let mut p = self.plane.lock().unwrap();
        let h = hash(policy, &extra);
        if let Some(cur) = p.revisions.last() {
            if cur.hash == h {
                return Ok(cur.version);
            }
            check_live_change(&cur.policy, policy)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        let version = p.revisions.last().map(|r| r.version + 1).unwrap_or(1);
        p.revisions.push(Revision {
            version,
            policy: policy.clone(),
            extra,
            hash: h,
        });
        // PENDING until the supervisor reports.
        p.status.insert(version, PolicyStatus::Pending as i32);
        Ok(version)
    }

    pub fn set_failure_mode(&self, mode: &str) {
        self.plane.lock().unwrap().failure_mode = mode.into();
    }

    /// The status of `version` as the user side sees it.
    pub fn policy_status(&self, version: u32) -> Option<PolicyStatus> {
        let p = self.plane.lock().unwrap();
        p.status
            .get(&version)
            .and_then(|s| PolicyStatus::try_from(*s).ok())
    }

    pub fn policy_reports(&self) -> Vec<ReportPolicyStatusRequest> {
        self.plane.lock().unwrap().reports.clone()
    }

    pub fn config_updates(&self) -> Vec<UpdateConfigRequest> {
        self.plane.lock().unwrap().updates.clone()
    }

    pub fn current_revision(&self) -> Option<Revision> {
        self.plane.lock().unwrap().revisions.last().cloned()
    }

    pub fn log_lines(&self) -> Vec<SandboxLogLine> {
        self.logs.lock().unwrap().lines.iter().cloned().collect()
    }

    /// GetSandboxConfig, answered as raw bytes.
    pub(super) fn get_sandbox_config(&self, req: &Request<Bytes>) -> Result<Bytes, Status> {
        let principal = self.principal(req)?;
        let r = pb::GetSandboxConfigRequest::decode(req.get_ref().as_ref())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.same_sandbox(&principal, &r.sandbox_id)?;
        if r.sandbox_id != self.sandbox_id {
            return Err(Status::not_found("sandbox not found"));
        }
        self.seen.lock().unwrap().config_calls += 1;
        let mut p = self.plane.lock().unwrap();
        p.config_calls += 1;
        if p.fail_config > 0 {
            p.fail_config -= 1;
            return Err(Status::new(
                p.fail_code.unwrap_or(tonic::Code::Unavailable),
                "injected GetSandboxConfig failure",
            ));
        }
        let cur = p.revisions.last().cloned();
        let envelope = pb::GetSandboxConfigResponse {
            policy: None,
            version: cur.as_ref().map(|c| c.version).unwrap_or(0),
            policy_hash: cur.as_ref().map(|c| c.hash.clone()).unwrap_or_default(),
            config_revision: cur.as_ref().map(|c| u64::from(c.version)).unwrap_or(0),
            policy_source: if cur.is_some() {
                pb::PolicySource::Sandbox as i32
            } else {
                pb::PolicySource::Unspecified as i32
            },
            workspace: "default".into(),
            policy_validation_failure_mode: p.failure_mode.clone(),
            provider_env_revision: self.provider_env.lock().unwrap().revision.max(1),
            ..Default::default()
        };
        let mut out = envelope.encode_to_vec();
        if let Some(c) = cur {
            let mut body = encode_policy(&c.policy);
            body.extend_from_slice(&c.extra);
            // Field 1, length-delimited.
            out.push(0x0a);
            prost::encoding::encode_varint(body.len() as u64, &mut out);
            out.extend_from_slice(&body);
        }
        Ok(Bytes::from(out))
    }

    pub(super) fn update_config(
        &self,
        req: Request<UpdateConfigRequest>,
    ) -> Result<UpdateConfigResponse, Status> {
        let principal = self.principal(&req)?;
        let r = req.into_inner();
        self.plane.lock().unwrap().updates.push(r.clone());
        // The supervisor is a sandbox principal (its JWT, or its certificate on v0.0.36).
        let _ = principal;
        {
            if r.name.is_empty() {
                return Err(Status::permission_denied(
                    "sandbox callers may only perform sandbox policy sync",
                ));
            }
            let Some(policy) = r.policy else {
                return Err(Status::permission_denied(
                    "sandbox callers may only perform sandbox policy sync",
                ));
            };
            if r.name != SANDBOX_NAME {
                return Err(Status::permission_denied(
                    "sandbox callers may only sync their own sandbox",
                ));
            }
            let bytes = policy.encode_to_vec();
            let model = openshell_sandbox::policy::openshell::decode_policy(&bytes)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            self.set_policy(&model)?;
        }
        Ok(UpdateConfigResponse {})
    }

    pub(super) fn report_policy_status(
        &self,
        req: Request<ReportPolicyStatusRequest>,
    ) -> Result<ReportPolicyStatusResponse, Status> {
        let principal = self.principal(&req)?;
        let r = req.into_inner();
        if r.sandbox_id.is_empty() || r.version == 0 {
            return Err(Status::invalid_argument(
                "sandbox_id and version are required",
            ));
        }
        let loaded = PolicyStatus::Loaded as i32;
        let failed = PolicyStatus::Failed as i32;
        if r.status != loaded && r.status != failed {
            return Err(Status::invalid_argument("status must be LOADED or FAILED"));
        }
        self.same_sandbox(&principal, &r.sandbox_id)?;
        let mut p = self.plane.lock().unwrap();
        if !p.revisions.iter().any(|x| x.version == r.version) {
            return Err(Status::not_found("unknown policy revision"));
        }
        p.status.insert(r.version, r.status);
        if r.status == loaded {
            let superseded = PolicyStatus::Superseded as i32;
            for (v, s) in p.status.iter_mut() {
                if *v < r.version && *s != failed {
                    *s = superseded;
                }
            }
        }
        p.reports.push(r);
        Ok(ReportPolicyStatusResponse {})
    }

    pub(super) async fn push_sandbox_logs(
        &self,
        req: Request<Streaming<PushSandboxLogsRequest>>,
    ) -> Result<PushSandboxLogsResponse, Status> {
        self.logs.lock().unwrap().calls += 1;
        if self.logs.lock().unwrap().unauthenticated {
            return Err(Status::unauthenticated("injected: token rejected"));
        }
        let principal = self.principal(&req)?;
        if self.auth == super::AuthMode::Jwt && principal.is_none() {
            return Err(Status::permission_denied(
                "this method requires a sandbox principal",
            ));
        }
        let mut inbound = req.into_inner();
        let mut validated: Option<String> = None;
        while let Some(batch) = inbound.message().await? {
            if batch.sandbox_id.is_empty() {
                continue;
            }
            match &validated {
                None => {
                    self.same_sandbox(&principal, &batch.sandbox_id)?;
                    if batch.sandbox_id != self.sandbox_id {
                        return Err(Status::not_found("sandbox not found"));
                    }
                    validated = Some(batch.sandbox_id.clone());
                }
                Some(id) if *id != batch.sandbox_id => {
                    return Err(Status::permission_denied(
                        "sandbox_id changed after validation",
                    ));
                }
                Some(_) => {}
            }
            let mut l = self.logs.lock().unwrap();
            l.batch_sizes.push(batch.logs.len());
            l.batch_times.push(Instant::now());
            for mut line in batch.logs.into_iter().take(KEPT_PER_BATCH) {
                line.source = "sandbox".into();
                line.sandbox_id = self.sandbox_id.clone();
                l.lines.push_back(line);
                if l.lines.len() > TAIL {
                    l.lines.pop_front();
                }
            }
        }
        Ok(PushSandboxLogsResponse {})
    }
}

/// `unauthenticated` for the log stream, on demand.
pub fn refuse_logs(st: &State, on: bool) {
    st.logs.lock().unwrap().unauthenticated = on;
}

/// Count of PushSandboxLogs calls so far.
pub fn log_calls(st: &State) -> u32 {
    st.logs.lock().unwrap().calls
}

/// A policy without /tmp (the test directories live there, so a grant is visible): the
/// system directories the machine has and `extra_ro` read-only, the workdir and /dev/null
/// writable, Landlock best effort, no network rules.
pub fn base_policy(extra_ro: &[&Path]) -> SandboxPolicy {
    let mut ro: Vec<String> = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| p.to_string())
        .collect();
    ro.extend(extra_ro.iter().map(|p| p.display().to_string()));
    SandboxPolicy {
        version: 1,
        filesystem: Some(FilesystemPolicy {
            include_workdir: true,
            read_only: ro,
            read_write: vec!["/dev/null".into()],
        }),
        landlock: Some(LandlockPolicy {
            compatibility: "best_effort".into(),
        }),
        ..Default::default()
    }
}

/// Wait for the supervisor's report of `version` and return it.
pub async fn wait_report(
    gw: &TestGateway,
    version: u32,
    sup: &Supervisor,
) -> ReportPolicyStatusRequest {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(r) = gw
            .state
            .policy_reports()
            .into_iter()
            .rev()
            .find(|r| r.version == version)
        {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "no ReportPolicyStatus for version {version}; reports {:?}; log:\n{}",
            gw.state.policy_reports(),
            sup.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
