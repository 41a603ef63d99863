//! `openshell-sandbox check`: what this kernel supports, and whether the default policy would
//! be fully enforced here. Exits 1 when it would not.

use std::process::ExitCode;

use serde::Serialize;

use crate::cli::CheckArgs;
use crate::policy::{FsPolicy, Identity, Limits, NOBODY, NetworkMode, Policy};
use crate::sandbox::{self, Enforcement, LayerStatus, identity, landlock};

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
    /// Why the default policy cannot be enforced, when it cannot.
    refused: Option<String>,
    fully_enforced: bool,
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

pub fn main(args: CheckArgs) -> anyhow::Result<ExitCode> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let workdir = std::env::temp_dir();
    let policy = Policy {
        fs: FsPolicy::with_defaults(workdir),
        network: NetworkMode::None,
        limits: Limits::default(),
        identity: (euid == 0).then_some(Identity {
            uid: NOBODY,
            gid: NOBODY,
        }),
        allow_degraded: false,
        namespaces: Default::default(),
    };
    let (layers, refused) = match sandbox::prepare(&policy) {
        Ok(p) => (p.layers, None),
        Err(e) => {
            // Prepare again, degraded, to list every layer's state.
            let degraded = Policy {
                allow_degraded: true,
                ..policy.clone()
            };
            let layers = sandbox::prepare(&degraded)
                .map(|p| p.layers)
                .unwrap_or_default();
            (layers, Some(e.to_string()))
        }
    };
    let fully = refused.is_none() && layers.iter().all(|l| l.status != Enforcement::Degraded);
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        root: euid == 0,
        euid,
        capabilities: identity::current_caps(),
        landlock: landlock::probe().ok(),
        seccomp: sandbox::seccomp_available(),
        no_new_privs: no_new_privs_works(),
        layers,
        refused,
        fully_enforced: fully,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
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
        for l in &report.layers {
            println!(
                "  {:<15} {:<13} {}",
                l.layer,
                format!("{:?}", l.status).to_lowercase(),
                l.detail
            );
        }
        match &report.refused {
            None if fully => println!("default policy: fully enforced"),
            None => println!("default policy: NOT fully enforced"),
            Some(r) => println!("default policy: NOT enforceable: {r}"),
        }
    }
    Ok(if fully {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
