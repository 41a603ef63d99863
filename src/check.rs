//! `openshell-sandbox check`: what this kernel supports, and whether a policy would be fully
//! enforced here. Exits 1 when it would not.
//!
//! The policy is the one `run` would build from the same flags (`--workdir`, `--uid`,
//! `--network`, `--memory`, `--policy FILE`, ...; see `exec::run::load_policy`). Without
//! `--workdir`, the workdir is an empty directory made in the temp directory for the check and
//! removed after it (the temp directory itself is the view's private tmpfs, refused as a
//! workdir), so that a bare `check` speaks about the kernel, not about the directory it was
//! started in. `--explain`
//! prints the effective Landlock and seccomp rules.
//!
//! `check` changes nothing: it takes no per-run uid lock (it names the first uid of
//! `--uid-range` instead, as any uid of the range is a stranger to a directory it does not
//! own), hands no directory over, and asks whether the sandbox uid can write the workdir from a
//! throwaway child (`exec::workdir`).
//!
//! It may run beside a live supervisor (`kubectl exec POD -- openshell-sandbox check`), so it
//! makes no cgroup and sweeps none (`sandbox::prepare_dry`).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use crate::cli::CheckArgs;
use crate::exec::{run, workdir};
use crate::policy::{Identity, Limits, NOBODY, NetworkMode, PathAccess, Policy, PolicyFlags};
use crate::sandbox::{self, Enforcement, LayerStatus, decide, identity, landlock};

#[derive(Serialize)]
struct Report {
    version: &'static str,
    root: bool,
    euid: u32,
    capabilities: Vec<String>,
    landlock: Option<landlock::Support>,
    seccomp: bool,
    no_new_privs: bool,
    layers: Vec<LayerStatus>,
    /// The policy that was checked; `None` when it could not be built (see `refused`).
    policy: Option<PolicySummary>,
    /// The policy file's best_effort skips and ignored keys.
    warnings: Vec<String>,
    /// Whether the sandbox identity can write the workdir.
    workdir: Option<WorkdirStatus>,
    /// Why the policy cannot be enforced, when it cannot.
    refused: Option<String>,
    fully_enforced: bool,
    /// With `--explain`: the Landlock rules as (path, access), as the run installs them.
    #[serde(skip_serializing_if = "Option::is_none")]
    landlock_rules: Option<Vec<decide::InstalledRule>>,
    /// With `--explain`: every seccomp rule, as `syscall: condition: action`.
    #[serde(skip_serializing_if = "Option::is_none")]
    seccomp_rules: Option<Vec<String>>,
    /// With `--explain`: the network rules the egress proxy keeps, one line each.
    #[serde(skip_serializing_if = "Option::is_none")]
    network_rules: Option<Vec<String>>,
    /// With `--explain`: each `--credential` and where the proxy would send it (never a
    /// value).
    #[serde(skip_serializing_if = "Option::is_none")]
    credentials: Option<Vec<String>>,
    /// Whether programs would start in the sandbox: the command given after `--`, or the
    /// system's shell, env and dynamic loader where the policy grants them.
    programs: Vec<ProgramCheck>,
    /// Every program checked would start.
    programs_start: bool,
}

#[derive(Serialize)]
struct ProgramCheck {
    program: String,
    starts: bool,
    /// Why it would not start, as `run` would say it.
    problem: Option<String>,
}

#[derive(Serialize)]
struct PolicySummary {
    /// `default` (no policy flag given), `flags`, or the policy file's path.
    source: String,
    workdir: PathBuf,
    network: NetworkMode,
    /// The keys of the network rules the egress proxy keeps (in the sandbox's own network
    /// namespace); `None`: no rules, no proxy.
    proxy_rules: Option<Vec<String>>,
    limits: Limits,
    /// Who the child would run as; `None`: the caller's own identity (not root).
    identity: Option<Identity>,
    /// Root without --uid: `run` takes a per-run uid of --uid-range; `identity` is its first.
    per_run_uid: bool,
    allow_degraded: bool,
}

#[derive(Serialize)]
struct WorkdirStatus {
    path: PathBuf,
    owner: Option<u32>,
    group: Option<u32>,
    mode: Option<String>,
    /// As whom the kernel checks the sandbox there (its owner through an idmapped mount),
    /// asked of the kernel.
    writable: bool,
    /// `run` binds it as an idmapped mount: the sandbox writes as its owner.
    idmapped: bool,
    /// Idmapped mounts are refused there, and `run` hands a workdir owned by 65534 or by a
    /// uid of the range to its per-run uid for the run.
    handed_over: bool,
    /// What is wrong and how to fix it, when it is not writable.
    problem: Option<String>,
}

/// Whether PR_SET_NO_NEW_PRIVS works, tested in a throwaway child so it does not stick to us.
fn no_new_privs_works() -> bool {
    // SAFETY: the child makes one prctl and exits; the parent waits for it.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let ok = libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1;
            libc::_exit(if ok { 0 } else { 1 });
        }
        if pid < 0 {
            return false;
        }
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0
    }
}

/// The layers' decisions, the one place `check` prepares a sandbox: `sandbox::prepare_dry`,
/// which decides every layer like `sandbox::prepare` but makes no cgroup root and sweeps no
/// stale groups.
fn prepare(policy: &Policy) -> Result<sandbox::Prepared, sandbox::PrepareError> {
    sandbox::prepare_dry(policy)
}

/// An empty directory for a bare `check`'s default policy, removed when dropped.
struct BareWorkdir {
    path: PathBuf,
    made: bool,
}

impl BareWorkdir {
    /// Made only when `needed` (no --workdir).
    fn new(needed: bool) -> BareWorkdir {
        let path = std::env::temp_dir().join(format!(
            "openshell-check-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        // A failure leaves the path missing: the policy then names it.
        let made = needed && std::fs::DirBuilder::new().create(&path).is_ok();
        BareWorkdir { path, made }
    }
}

impl Drop for BareWorkdir {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}

/// The error and its causes on one line, as `main` renders them.
fn render(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cause = c.source();
    }
    out
}

/// Why `check` could not give its answer. A policy that cannot be loaded, or a flag that
/// cannot work, is the error it is for `run`.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Run(#[from] crate::exec::RunError),
    #[error("writing the JSON answer: {0}")]
    Json(#[from] serde_json::Error),
}

impl CheckError {
    /// Which row of the exit-code table (`crate::exit`) this is: `run`'s for what `run` would
    /// refuse too, failed otherwise.
    pub fn exit(&self) -> crate::exit::Exit {
        match self {
            CheckError::Run(e) => e.exit(),
            CheckError::Json(_) => crate::exit::Exit::Failed,
        }
    }
}

pub fn main(args: CheckArgs) -> Result<ExitCode, CheckError> {
    crate::logging::init(&args.policy.log_level, args.policy.log_format);
    let euid = crate::sys::process::euid();
    let root = euid == 0;
    let source = match (&args.policy_file, args.flags == PolicyFlags::default()) {
        (Some(p), _) => p.display().to_string(),
        (None, true) => "default".to_string(),
        (None, false) => "flags".to_string(),
    };
    let mut refused = None;
    let mut warnings = Vec::new();
    let mut per_run_uid = false;
    // Without --workdir, an empty directory of its own in the temp directory (removed again),
    // so that a bare `check` speaks about the kernel: the temp directory itself is the view's
    // private tmpfs, refused as a workdir.
    let bare = BareWorkdir::new(args.flags.workdir.is_none());
    let mut network_rules = None;
    let mut credentials = None;
    let mut proxy_rules = None;
    let loaded = run::load_policy(
        &args.flags,
        args.policy_file.as_deref(),
        &bare.path,
        &args.allow_net,
    );
    if let Some(target) = &args.egress {
        return check_egress(loaded, target, args.binary.as_deref(), args.json);
    }
    let policy = match loaded {
        Ok(loaded) => {
            network_rules = loaded.network.as_ref().map(crate::exec::egress::describe);
            if !args.credential.is_empty() {
                let c =
                    crate::exec::egress::run_credentials(&args.credential, loaded.network.as_ref())
                        .map_err(crate::exec::RunError::from)?;
                credentials = Some(crate::exec::credential_flags::describe(&c));
            }
            proxy_rules = loaded
                .network
                .as_ref()
                .map(|n| n.rules().iter().map(|r| r.key.clone()).collect());
            // Said once, in the report (`warning:` lines, or the JSON's `warnings`), not also
            // in the log.
            warnings = loaded.warnings.iter().map(|w| w.to_string()).collect();
            let mut policy = loaded.policy;
            if root {
                policy.fs.write_as = crate::policy::WriteAs::Owner {
                    hand_over: args.uid_range.start..=args.uid_range.end,
                };
            }
            if root && args.flags.uid.is_none() && !loaded.file_sets_identity {
                per_run_uid = true;
                let uid = args.uid_range.start;
                policy.set_identity(Identity { uid, gid: uid });
            }
            Some(policy)
        }
        Err(e) => {
            refused = Some(render(&e));
            None
        }
    };

    // The layers: of the policy when there is one, else of the default, for the kernel facts.
    let layered = policy
        .clone()
        .unwrap_or_else(|| default_policy(&bare.path, root));
    // The Landlock rules as the prepared sandbox holds them (a missing deny path is not split
    // around where the view's mount namespace is private; the view's tmpfs roots are rules of
    // their own): what `--explain` shows is what a run here would install.
    let prepared = prepare_or_degraded(&layered, &mut refused);
    let (layers, installed, ownership) = prepared
        .as_ref()
        .map(|(_, p)| (p.layers.clone(), p.installed.clone(), p.ownership.clone()))
        .unwrap_or_default();
    // Of the policy checked only (the default one speaks about the kernel).
    let programs = match (prepared, &policy) {
        (Some((prepared_policy, p)), Some(_)) => check_programs(
            &crate::exec::Supervisor::new()?,
            prepared_policy,
            p,
            &args.command,
        ),
        _ => Vec::new(),
    };

    let workdir = policy
        .as_ref()
        .map(|p| workdir_status(p, &ownership, root, per_run_uid));
    // `run` refuses such a workdir when it is root (a non-root run keeps our own identity,
    // whose access to its own directories is the caller's business).
    if let Some(w) = &workdir
        && root
        && !w.writable
    {
        refused.get_or_insert(w.problem.clone().unwrap_or_default());
    }

    // The rules as the prepared sandbox installs them (sandbox::decide), never worked out
    // again from the policy: with --network none in a private network namespace, the socket
    // rules are those of --network all.
    let (landlock_rules, seccomp_rules) = match (&policy, args.explain) {
        (Some(_), true) => (Some(installed.landlock), Some(installed.seccomp)),
        _ => (None, None),
    };

    let fully = refused.is_none() && layers.iter().all(|l| l.status != Enforcement::Degraded);
    let programs_start = programs.iter().all(|p| p.starts);
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        root,
        euid,
        capabilities: identity::current_caps(),
        landlock: landlock::probe().ok(),
        seccomp: sandbox::seccomp_available(),
        no_new_privs: no_new_privs_works(),
        layers,
        policy: policy.as_ref().map(|p| PolicySummary {
            source: source.clone(),
            workdir: p.fs.workdir.clone(),
            network: p.network,
            proxy_rules: proxy_rules.clone(),
            limits: p.limits.clone(),
            identity: if root { p.identity } else { None },
            per_run_uid,
            allow_degraded: p.allow_degraded,
        }),
        warnings,
        workdir,
        refused,
        fully_enforced: fully,
        landlock_rules,
        seccomp_rules,
        network_rules: args.explain.then(|| network_rules.unwrap_or_default()),
        credentials: credentials.filter(|_| args.explain),
        programs,
        programs_start,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report, &source);
    }
    Ok(if fully && programs_start {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::Exit::Failed.code())
    })
}

/// The sandbox `layered` prepares to, with the policy it was prepared for; when it is refused
/// (the refusal goes in `refused`), prepared again degraded, to list every layer's state.
fn prepare_or_degraded(
    layered: &Policy,
    refused: &mut Option<String>,
) -> Option<(Policy, sandbox::Prepared)> {
    match prepare(layered) {
        Ok(p) => Some((layered.clone(), p)),
        Err(e) => {
            refused.get_or_insert(e.to_string());
            let degraded = Policy {
                allow_degraded: true,
                ..layered.clone()
            };
            prepare(&degraded).ok().map(|p| (degraded, p))
        }
    }
}

/// The policy `check` reports the layers of when it has none of its own: the defaults, for
/// the kernel's facts.
fn default_policy(workdir: &std::path::Path, root: bool) -> Policy {
    Policy {
        fs: crate::policy::FsPolicy::with_defaults(workdir.to_path_buf()),
        network: NetworkMode::None,
        limits: Limits::default(),
        identity: root.then_some(Identity {
            uid: NOBODY,
            gid: NOBODY,
        }),
        allow_degraded: false,
        namespaces: Default::default(),
    }
}

/// The workdir as a run here would find it: its owner and mode, whether the run's uid could
/// write it (decided by prepare's ownership, as for `run`), and why not.
fn workdir_status(
    p: &Policy,
    ownership: &crate::sandbox::ownership::Ownership,
    root: bool,
    per_run_uid: bool,
) -> WorkdirStatus {
    let path = p.fs.workdir.clone();
    let meta = std::fs::metadata(&path).ok();
    let owner = meta.as_ref().map(|m| m.uid());
    // Decided by prepare, as for `run`.
    let handed_over = ownership.hand_over.is_some();
    let writer = ownership.workdir_writer();
    let idmapped = root && writer != p.identity;
    let chown_to = |id: Identity| {
        if per_run_uid {
            Identity {
                uid: NOBODY,
                gid: NOBODY,
            }
        } else {
            id
        }
    };
    let (writable, problem) = match (root, writer) {
        // Once handed over, the run's uid has what the owner has.
        (true, Some(_)) if handed_over => {
            let from = ownership.hand_over.as_ref().map(|h| h.from);
            match from.map(|f| workdir::check_writable(&path, f, f, true)) {
                Some(Err(e)) => (false, Some(e.to_string())),
                _ => (true, None),
            }
        }
        (true, Some(id)) => match workdir::check_writable(&path, id, chown_to(id), idmapped) {
            Ok(()) => (true, None),
            Err(e) => (false, Some(e.to_string())),
        },
        _ => match workdir::can_write(&path, None) {
            Ok(()) => (true, None),
            Err(e) => (false, Some(format!("not writable by us: {e}"))),
        },
    };
    WorkdirStatus {
        path,
        owner,
        group: meta.as_ref().map(|m| m.gid()),
        mode: meta.as_ref().map(|m| format!("{:04o}", m.mode() & 0o7777)),
        writable,
        idmapped,
        handed_over,
        problem,
    }
}

/// Whether programs would start under the prepared sandbox (`Sandbox::probe`: examined inside
/// the view as the sandbox identity, nothing executed): `command`'s, or else the system's
/// /bin/sh, /usr/bin/env and the dynamic loader /bin/sh names, each only where the policy
/// grants it on the host (a policy that grants no /bin/sh means it to be absent). This is the
/// usr-merge check: a policy written for Landlock on the real root grants /usr and expects
/// /bin/sh and /lib64/ld-linux-x86-64.so.2 to work through the root's links.
fn check_programs(
    supervisor: &crate::exec::Supervisor,
    policy: Policy,
    prepared: sandbox::Prepared,
    command: &[std::ffi::OsString],
) -> Vec<ProgramCheck> {
    use std::os::fd::AsFd;
    use std::path::Path;
    let walker = policy.fs.walker();
    let granted = |p: &Path| {
        walker.resolve_path(p).is_ok_and(|(path, _)| {
            prepared
                .fs_rules
                .iter()
                .any(|(g, access, _)| *access != PathAccess::Device && path.starts_with(g))
        })
    };
    let mut names: Vec<(std::ffi::OsString, String)> = Vec::new();
    if let Some(c) = command.first() {
        names.push((c.clone(), c.to_string_lossy().into_owned()));
    } else {
        for p in ["/bin/sh", "/usr/bin/env"] {
            if granted(Path::new(p)) {
                names.push((p.into(), p.into()));
            }
        }
        let loader = walker
            .resolve(Path::new("/bin/sh"))
            .ok()
            .and_then(|sh| sandbox::diagnose::interpreter_of(sh.fd.as_fd()));
        if let Some(l) = loader.filter(|l| granted(l)) {
            let shown = format!("{} (the dynamic loader /bin/sh names)", l.display());
            names.push((l.into_os_string(), shown));
        }
    }
    let sandbox = crate::exec::Sandbox::from_prepared(supervisor, policy, prepared);
    names
        .into_iter()
        .map(|(name, program)| {
            let problem = match sandbox.probe(&name) {
                Ok(None) => None,
                Ok(Some(e)) => Some(e.to_string()),
                Err(e) => Some(render(&e)),
            };
            ProgramCheck {
                program,
                starts: problem.is_none(),
                problem,
            }
        })
        .collect()
}

fn print_human(report: &Report, source: &str) {
    println!("openshell-sandbox {}", report.version);
    println!(
        "running as: euid {}{}",
        report.euid,
        if report.root { " (root)" } else { "" }
    );
    println!(
        "capabilities: {}",
        if report.capabilities.is_empty() {
            "none".into()
        } else {
            report.capabilities.join(" ")
        }
    );
    match report.landlock {
        Some(s) => println!(
            "landlock: ABI {} (filesystem {}, tcp {}, scopes {})",
            s.abi,
            yes(s.filesystem),
            yes(s.network),
            yes(s.scopes)
        ),
        None => println!("landlock: unavailable"),
    }
    println!("seccomp filters: {}", yes(report.seccomp));
    println!("no_new_privs: {}", yes(report.no_new_privs));
    if let Some(p) = &report.policy {
        let who = match p.identity {
            Some(id) if p.per_run_uid => {
                format!("a per-run uid of --uid-range (from {}, gid = uid)", id.uid)
            }
            Some(id) => format!("uid {} gid {}", id.uid, id.gid),
            None => "our own uid and gid".into(),
        };
        println!(
            "policy ({}): workdir {}, runs as {who}",
            p.source,
            p.workdir.display(),
        );
        println!(
            "network: {}",
            network_line(p.network, p.proxy_rules.as_deref())
        );
        let l = &p.limits;
        let opt = |v: Option<u64>, unit: &str| {
            v.map_or("unlimited".to_string(), |v| format!("{v} {unit}"))
        };
        println!(
            "limits: cpu {}, memory {}, pids {}, file size {}, open files {}",
            opt(l.cpu_secs, "s"),
            opt(l.memory_bytes, "B"),
            l.pids,
            opt(l.file_size_bytes, "B"),
            l.open_files
        );
    }
    for w in &report.warnings {
        println!("warning: {w}");
    }
    if let Some(w) = &report.workdir {
        match (&w.problem, w.handed_over) {
            (None, true) => println!(
                "workdir {}: writable (idmapped mounts are refused there: run hands it to its per-run uid)",
                w.path.display()
            ),
            (None, false) if w.idmapped => println!(
                "workdir {}: writable by the sandbox, as its owner (an idmapped mount)",
                w.path.display()
            ),
            (None, false) => println!("workdir {}: writable by the sandbox", w.path.display()),
            (Some(p), _) => println!("workdir {}: NOT writable: {p}", w.path.display()),
        }
    }
    for l in &report.layers {
        println!("  {:<15} {:<13} {}", l.layer, l.status.as_str(), l.detail);
    }
    if let Some(rules) = &report.landlock_rules {
        println!("landlock rules (path, access):");
        let width = rules
            .iter()
            .map(|r| r.path.as_os_str().len())
            .max()
            .unwrap_or(0)
            .min(60);
        for r in rules {
            println!("  {:<width$}  {}", r.path.display(), r.access);
        }
    }
    if let Some(rules) = &report.seccomp_rules {
        println!("seccomp rules (syscall: condition: action; everything else is allowed):");
        for r in rules {
            println!("  {r}");
        }
    }
    if let Some(rules) = &report.network_rules {
        if rules.is_empty() {
            println!("network rules: none (no egress proxy)");
        } else {
            println!(
                "network rules (key: host:ports <- binaries), kept by the egress proxy at {}:",
                crate::egress::netns::PROXY_ADDR
            );
            for r in rules {
                println!("  {r}");
            }
        }
    }
    if let Some(creds) = &report.credentials {
        println!(
            "credentials (name -> where the proxy puts its value; children hold a placeholder):"
        );
        for c in creds {
            println!("  {c}");
        }
    }
    if !report.programs.is_empty() {
        println!("programs (would they start in the sandbox):");
        for p in &report.programs {
            match &p.problem {
                None => println!("  {}: starts", p.program),
                Some(why) => println!("  {}: CANNOT START: {why}", p.program),
            }
        }
    }
    let what = if source == "default" {
        "default policy"
    } else {
        "policy"
    };
    let failing = report.programs.iter().filter(|p| !p.starts).count();
    match &report.refused {
        None if report.fully_enforced && failing > 0 => println!(
            "{what}: fully enforced, but {failing} of the programs checked cannot start in the sandbox (above)"
        ),
        None if report.fully_enforced => println!("{what}: fully enforced"),
        None => println!("{what}: NOT fully enforced"),
        Some(r) => println!("{what}: NOT enforceable: {r}"),
    }
}

/// What a run gets on the network, in words: the proxy and its rules when there are rules
/// (the run's network namespace then holds only `lo` and the proxy), else the mode.
fn network_line(mode: NetworkMode, proxy_rules: Option<&[String]>) -> String {
    match (proxy_rules, mode) {
        (Some(keys), _) => format!(
            "proxy, {} rule{}: {} (only through the egress proxy at {}; nothing else leaves)",
            keys.len(),
            if keys.len() == 1 { "" } else { "s" },
            keys.join(", "),
            crate::egress::netns::PROXY_ADDR
        ),
        (None, NetworkMode::None) => {
            "none (a network namespace with only lo: loopback works, nothing leaves)".into()
        }
        (None, NetworkMode::All) => "all (the host's network)".into(),
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// `check --egress`: print the answer (or the JSON with `--json`); exit 0 allowed, 1 denied.
/// A policy that cannot be loaded is the error it is for `run`.
fn check_egress(
    loaded: Result<crate::exec::run::LoadedPolicy, crate::exec::RunError>,
    target: &str,
    binary: Option<&str>,
    json: bool,
) -> Result<ExitCode, CheckError> {
    let loaded = loaded?;
    let (host, port) = crate::exec::egress::parse_target(target)?;
    if let Some(b) = binary
        && !b.starts_with('/')
    {
        return Err(crate::exec::RunError::Usage(format!(
            "--binary {b}: the executable is matched by its absolute path (e.g. /usr/bin/curl)"
        ))
        .into());
    }
    let a = crate::exec::egress::answer(loaded.network.as_ref(), &host, port, binary);
    if json {
        println!("{}", serde_json::to_string_pretty(&a)?);
    } else {
        let what = format!("{}:{}", a.host, a.port);
        match (&a.rule, &a.reason) {
            (Some(rule), _) if a.binary.is_none() => println!(
                "egress {what}: allowed by rule '{rule}' for {}",
                a.binaries.join(", ")
            ),
            (Some(rule), _) => println!(
                "egress {what} from {}: allowed by rule '{rule}'",
                a.binary.as_deref().unwrap_or_default()
            ),
            (None, reason) => println!(
                "egress {what}{}: denied: {}",
                a.binary
                    .as_deref()
                    .map(|b| format!(" from {b}"))
                    .unwrap_or_default(),
                reason.as_deref().unwrap_or_default()
            ),
        }
    }
    Ok(if a.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::Exit::Failed.code())
    })
}
