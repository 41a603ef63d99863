//! Mapping the OpenShell model onto our [`Policy`], with explicit flags on top.
//!
//! The file's filesystem lists are the whole grant set (our built-in system list is not
//! added); flags override the file only where they were given; what we cannot enforce as
//! written is an error that names the key. A non-empty `network_policies` comes back as
//! [`NetworkOutcome::EgressDenied`]: the mapped policy keeps the sandbox's own network
//! namespace with nothing reachable, and the caller hands the rules to the egress proxy it
//! starts there (`exec::egress`, `gateway::egress`; docs/egress.md).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use super::model::{FilesystemPolicy, NetworkPolicyRule, ProcessPolicy, SandboxPolicy};
use crate::policy::{
    FsPolicy, Identity, NOBODY, NetworkMode, Policy, PolicyError, PolicyFlags, default_secret_paths,
};

/// `landlock.compatibility`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compatibility {
    /// A missing path is skipped, with a [`MapWarning`].
    BestEffort,
    /// A missing path is an error.
    HardRequirement,
}

/// What the policy asked for and we skipped; data for the caller's log or report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapWarning {
    /// `best_effort`: a listed path does not exist (or cannot be looked at) here.
    SkippedPath {
        key: String,
        path: PathBuf,
        kind: std::io::ErrorKind,
    },
    /// `network_middlewares` is present; it only configures egress middleware, which the
    /// egress proxy does not apply.
    IgnoredMiddlewares,
}

impl std::fmt::Display for MapWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapWarning::SkippedPath { key, path, kind } => write!(
                f,
                "{key}: {} skipped ({kind}; landlock.compatibility is best_effort)",
                path.display()
            ),
            MapWarning::IgnoredMiddlewares => {
                write!(
                    f,
                    "network_middlewares ignored: the egress proxy applies no middleware"
                )
            }
        }
    }
}

/// What becomes of the policy's network part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkOutcome {
    /// Enforced as asked: no rules (all egress denied), or an explicit `--network` flag.
    Enforced,
    /// `network_policies` asks for egress allow-lists. The returned policy denies all direct
    /// egress (`--network none`); the rules are the egress proxy's, which the caller starts
    /// in the sandbox's namespace.
    EgressDenied { rule_keys: Vec<String> },
}

/// Why a policy cannot be mapped. Each names the OpenShell key at fault.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error(
        "filesystem_policy: {why}; OpenShell would run without Landlock, this sandbox never does: list the paths to grant"
    )]
    NoFilesystem { why: &'static str },
    #[error("filesystem_policy: none of the listed paths exists here, so nothing could be granted")]
    NoPathOpened,
    #[error("{key}: `{path}` is not an absolute path")]
    Relative { key: String, path: String },
    #[error("{key}: `{path}` has a `..` component; give the path it means")]
    DotDot { key: String, path: String },
    #[error(
        "{key}: {path} is below /proc; a rule there would bind to the supervisor's own process, only /proc as a whole can be granted"
    )]
    ProcSubpath { key: String, path: PathBuf },
    #[error("{key}: {path} holds supervisor secrets and is never granted")]
    Secret { key: String, path: PathBuf },
    #[error("{key}: {path}: {source} (landlock.compatibility is hard_requirement)")]
    Missing {
        key: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "filesystem_policy.include_workdir is false, but the workdir {0} is always granted read-write here: set include_workdir, or list the workdir (or a parent) in read_write"
    )]
    WorkdirNotListed(PathBuf),
    #[error("landlock.compatibility: `{0}` is neither best_effort nor hard_requirement")]
    Compatibility(String),
    #[error(
        "landlock.compatibility: hard_requirement forbids running without Landlock, and --allow-degraded allows it; drop one"
    )]
    HardRequirementDegraded,
    #[error("{key}: `{value}` is neither `sandbox` nor a number in 1..=4294967294")]
    RunAs { key: &'static str, value: String },
    #[error(
        "{key}: running as {want} needs root; this supervisor runs as {have} and cannot switch"
    )]
    NeedsRoot {
        key: &'static str,
        want: u32,
        have: u32,
    },
    #[error(
        "network_policies: egress allow-lists are not enforceable until egress rules exist (rules: {}); without them all egress is denied",
        .0.join(", ")
    )]
    NetworkRules(Vec<String>),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// The facts about this process that identity resolution needs. [`Host::current`] reads them;
/// tests build one by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub euid: u32,
    pub egid: u32,
    /// The image's `sandbox` user (from /etc/passwd), when it has one.
    pub sandbox_user: Option<Identity>,
}

impl Host {
    pub fn current() -> Host {
        let (euid, egid) = (crate::sys::process::euid(), crate::sys::process::egid());
        let sandbox_user = std::fs::read_to_string("/etc/passwd")
            .ok()
            .and_then(|t| passwd_lookup(&t, "sandbox"));
        Host {
            euid,
            egid,
            sandbox_user,
        }
    }

    fn root(&self) -> bool {
        self.euid == 0
    }
}

/// `name:x:uid:gid:...` in passwd(5) format.
pub(super) fn passwd_lookup(passwd: &str, name: &str) -> Option<Identity> {
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        if f.next()? != name {
            return None;
        }
        let _pw = f.next()?;
        Some(Identity {
            uid: f.next()?.parse().ok()?,
            gid: f.next()?.parse().ok()?,
        })
    })
}

/// A mapped policy and what the caller must know about it.
#[derive(Debug)]
pub struct Resolved {
    /// Validated; with [`NetworkOutcome::EgressDenied`] its network is `None`.
    pub policy: Policy,
    pub compatibility: Compatibility,
    pub warnings: Vec<MapWarning>,
    pub network: NetworkOutcome,
}

impl Resolved {
    /// For a caller with no egress proxy: a policy whose network rules nobody would keep is
    /// an error. Warnings (best_effort skips) are kept.
    pub fn into_enforceable(self) -> Result<(Policy, Vec<MapWarning>), MapError> {
        match self.network {
            NetworkOutcome::Enforced => Ok((self.policy, self.warnings)),
            NetworkOutcome::EgressDenied { rule_keys } => Err(MapError::NetworkRules(rule_keys)),
        }
    }

    /// The rules of `file` (the policy this was resolved from) that the egress proxy keeps:
    /// its `network_policies` when they were mapped to [`NetworkOutcome::EgressDenied`];
    /// none when an explicit `--network` replaced the file's network section or it has no
    /// rules. `run` and `serve` both take the proxy's rules from here.
    pub fn proxy_rules<'a>(
        &self,
        file: &'a SandboxPolicy,
    ) -> Option<&'a BTreeMap<String, NetworkPolicyRule>> {
        match self.network {
            NetworkOutcome::EgressDenied { .. } => Some(&file.network_policies),
            NetworkOutcome::Enforced => None,
        }
    }
}

/// Map `file` onto our policy. `flags` override it where they are set (list flags add to the
/// file's lists); `default_workdir` applies without `--workdir`; `extra_deny` are secret
/// paths (TLS, tokens) that are never granted.
///
/// Reads the filesystem (existence and type of each listed path) but changes nothing.
pub fn resolve(
    file: &SandboxPolicy,
    flags: &PolicyFlags,
    default_workdir: &Path,
    extra_deny: Vec<PathBuf>,
    host: &Host,
) -> Result<Resolved, MapError> {
    let compatibility = match file.landlock.as_ref().map(|l| l.compatibility.as_str()) {
        None | Some("") | Some("best_effort") => Compatibility::BestEffort,
        Some("hard_requirement") => Compatibility::HardRequirement,
        Some(other) => return Err(MapError::Compatibility(other.to_string())),
    };
    if compatibility == Compatibility::HardRequirement && flags.allow_degraded {
        return Err(MapError::HardRequirementDegraded);
    }
    let workdir = flags.workdir(default_workdir)?;
    let mut deny = default_secret_paths();
    deny.extend(flags.deny.iter().cloned());
    deny.extend(extra_deny);

    let mut warnings = Vec::new();
    let fs_file = file.filesystem.as_ref().ok_or(MapError::NoFilesystem {
        why: "the section is absent",
    })?;
    let mut fs = map_filesystem(fs_file, &workdir, &deny, compatibility, &mut warnings)?;
    fs.read_only.extend(flags.ro.iter().cloned());
    fs.read_write.extend(flags.rw.iter().cloned());
    fs.deny = deny;

    if file.network_middlewares.is_some() {
        warnings.push(MapWarning::IgnoredMiddlewares);
    }
    let (network, outcome) = match flags.network {
        // An explicit flag replaces the file's network section as a whole.
        Some(mode) => (mode, NetworkOutcome::Enforced),
        None if file.network_policies.is_empty() => (NetworkMode::None, NetworkOutcome::Enforced),
        None => (
            NetworkMode::None,
            NetworkOutcome::EgressDenied {
                rule_keys: file.network_policies.keys().cloned().collect(),
            },
        ),
    };
    let identity = resolve_identity(file.process.as_ref(), flags, host)?;
    let policy = Policy {
        fs,
        network,
        limits: flags.limits(),
        identity,
        allow_degraded: flags.allow_degraded,
        namespaces: flags.namespaces(),
    };
    policy.validate()?;
    Ok(Resolved {
        policy,
        compatibility,
        warnings,
        network: outcome,
    })
}

/// Lexical normal form of a listed path: absolute, no `.`, no repeated or trailing `/`. A
/// `..` is refused rather than resolved: through a symlink it would mean something else.
fn normalise(key: &str, raw: &str) -> Result<PathBuf, MapError> {
    let p = Path::new(raw);
    if !p.is_absolute() {
        return Err(MapError::Relative {
            key: key.to_string(),
            path: raw.to_string(),
        });
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                return Err(MapError::DotDot {
                    key: key.to_string(),
                    path: raw.to_string(),
                });
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

fn map_filesystem(
    f: &FilesystemPolicy,
    workdir: &Path,
    deny: &[PathBuf],
    compatibility: Compatibility,
    warnings: &mut Vec<MapWarning>,
) -> Result<FsPolicy, MapError> {
    if f.read_only.is_empty() && f.read_write.is_empty() && !f.include_workdir {
        return Err(MapError::NoFilesystem {
            why: "both lists are empty and include_workdir is false",
        });
    }
    let deny_canon: Vec<PathBuf> = deny
        .iter()
        .flat_map(|d| [d.clone(), d.canonicalize().unwrap_or_else(|_| d.clone())])
        .collect();
    let mut fs = FsPolicy {
        workdir: workdir.to_path_buf(),
        ..Default::default()
    };
    let mut granted = 0usize;
    let mut rw_canon = Vec::new();
    for (list, write) in [("read_only", false), ("read_write", true)] {
        let entries = if write { &f.read_write } else { &f.read_only };
        for (i, raw) in entries.iter().enumerate() {
            let key = format!("filesystem_policy.{list}[{i}]");
            let path = normalise(&key, raw)?;
            if path.starts_with("/proc") && path != Path::new("/proc") {
                return Err(MapError::ProcSubpath { key, path });
            }
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(source) => match compatibility {
                    Compatibility::HardRequirement => {
                        return Err(MapError::Missing { key, path, source });
                    }
                    Compatibility::BestEffort => {
                        warnings.push(MapWarning::SkippedPath {
                            key,
                            path,
                            kind: source.kind(),
                        });
                        continue;
                    }
                },
            };
            let canon = path.canonicalize().unwrap_or_else(|_| path.clone());
            if deny_canon
                .iter()
                .any(|d| path.starts_with(d) || canon.starts_with(d))
            {
                return Err(MapError::Secret { key, path });
            }
            granted += 1;
            use std::os::unix::fs::FileTypeExt;
            if write && (path == Path::new("/tmp") || path == Path::new("/dev/shm")) {
                // OpenShell grants the container's own /tmp and /dev/shm. Ours are the view's
                // private tmpfs mounts (one per sandbox, writable, gone with it); granting the
                // host's here would bind the shared one back over them.
                continue;
            }
            if path == Path::new("/proc") && !write {
                fs.proc_read = true;
            } else if write && meta.file_type().is_char_device() {
                fs.devices.push(path);
            } else if write {
                rw_canon.push(canon);
                fs.read_write.push(path);
            } else {
                fs.read_only.push(path);
            }
        }
    }
    if granted == 0 && !f.include_workdir {
        return Err(MapError::NoPathOpened);
    }
    if !f.include_workdir {
        // Our FsPolicy always grants the workdir read-write; that is only what the file asked
        // for when a read-write entry already covers it.
        let wd = workdir
            .canonicalize()
            .unwrap_or_else(|_| workdir.to_path_buf());
        if !rw_canon.iter().any(|p| wd.starts_with(p)) {
            return Err(MapError::WorkdirNotListed(workdir.to_path_buf()));
        }
    }
    Ok(fs)
}

/// One `run_as_*` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdSpec {
    Omitted,
    Sandbox,
    Id(u32),
}

fn parse_id(key: &'static str, v: &str) -> Result<IdSpec, MapError> {
    match v {
        "" => Ok(IdSpec::Omitted),
        "sandbox" => Ok(IdSpec::Sandbox),
        // Root (0) is no sandbox identity, and u32::MAX is (uid_t)-1, "no change" to setresuid.
        _ => match v.parse::<u32>() {
            Ok(n) if (1..u32::MAX).contains(&n) && v.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(IdSpec::Id(n))
            }
            _ => Err(MapError::RunAs {
                key,
                value: v.to_string(),
            }),
        },
    }
}

/// Who the child runs as, from the file's `process` section and the flags.
///
/// - `--uid`/`--gid` (or `OPENSHELL_SANDBOX_UID/GID`) replace both fields, as the K8s driver's
///   variables do in OpenShell; `--gid` without `--uid` is refused as in [`Policy::from_args`].
/// - `sandbox`, or an omitted field: the image's `sandbox` user when root and it exists, else
///   65534 when root; without root, we keep our own identity (we are already unprivileged).
/// - A number: exactly that id; without root it must be our own.
/// - An omitted group beside a numeric user is that number, as `--gid` defaults to `--uid`.
pub fn resolve_identity(
    process: Option<&ProcessPolicy>,
    flags: &PolicyFlags,
    host: &Host,
) -> Result<Option<Identity>, MapError> {
    match (flags.uid, flags.gid) {
        (None, Some(_)) => return Err(PolicyError::GidWithoutUid.into()),
        (Some(uid), gid) => {
            return Ok(Some(Identity {
                uid,
                gid: gid.unwrap_or(uid),
            }));
        }
        (None, None) => {}
    }
    let empty = ProcessPolicy::default();
    let p = process.unwrap_or(&empty);
    let user = parse_id("process.run_as_user", &p.run_as_user)?;
    let group = parse_id("process.run_as_group", &p.run_as_group)?;
    let sandbox = host.sandbox_user.unwrap_or(Identity {
        uid: NOBODY,
        gid: NOBODY,
    });
    if host.root() {
        let uid = match user {
            IdSpec::Id(n) => n,
            IdSpec::Omitted | IdSpec::Sandbox => sandbox.uid,
        };
        let gid = match (group, user) {
            (IdSpec::Id(n), _) => n,
            (IdSpec::Omitted, IdSpec::Id(n)) => n,
            _ => sandbox.gid,
        };
        return Ok(Some(Identity { uid, gid }));
    }
    for (key, spec, have) in [
        ("process.run_as_user", user, host.euid),
        ("process.run_as_group", group, host.egid),
    ] {
        if let IdSpec::Id(want) = spec
            && want != have
        {
            return Err(MapError::NeedsRoot { key, want, have });
        }
    }
    Ok(None)
}
