//! The orchestrator: [`prepare`] asks the kernel what it offers, builds every layer's kernel
//! object in the order the layers need (the view first: Landlock grants its private tmpfs
//! roots), and takes each row from the decisions (`decide.rs`), handing them what it found.

use seccompiler::BpfProgram;

use super::layer::{LayerStatus, PrepareError};
use super::prepared::Prepared;
use super::view_layer;
use super::{cgroup, decide, identity, kernel, landlock, namespaces, ownership, rlimits, seccomp};
use crate::policy::{FsRule, PathAccess, Policy, expand_grants_skipping};

/// Build every kernel object for `policy`, refusing when a requested layer cannot be enforced
/// and `policy.allow_degraded` is false.
pub fn prepare(policy: &Policy) -> Result<Prepared, PrepareError> {
    let p = prepare_inner(&kernel::Real, policy, Cgroups::Create)?;
    dump_installed(&p);
    Ok(p)
}

/// For the tests that compare `check --explain` with a run: with `OSB_DUMP_INSTALLED=FILE`,
/// the rules a run's commands get, as JSON. Only with the `test-pause-points` feature.
#[cfg(feature = "test-pause-points")]
pub(super) fn dump_installed(p: &Prepared) {
    if let Some(path) = std::env::var_os("OSB_DUMP_INSTALLED")
        && let Ok(json) = serde_json::to_vec(&p.installed)
    {
        let _ = std::fs::write(path, json);
    }
}

#[cfg(not(feature = "test-pause-points"))]
#[inline(always)]
pub(super) fn dump_installed(_: &Prepared) {}

/// [`prepare`] for `check`: the same decisions, but with no lasting side effect on the
/// system: no cgroup is made, no process moved, no other supervisor's group swept. (The view
/// is made and dropped again: its namespaces die with their descriptors.)
pub fn prepare_dry(policy: &Policy) -> Result<Prepared, PrepareError> {
    prepare_inner(&kernel::Real, policy, Cgroups::ProbeOnly)
}

/// [`prepare`] against any [`kernel::Kernel`] (a fake one in the unit tests).
pub fn prepare_with(k: &dyn kernel::Kernel, policy: &Policy) -> Result<Prepared, PrepareError> {
    prepare_inner(k, policy, Cgroups::Create)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cgroups {
    Create,
    ProbeOnly,
}

fn prepare_inner(
    k: &dyn kernel::Kernel,
    policy: &Policy,
    cgroup_mode: Cgroups,
) -> Result<Prepared, PrepareError> {
    let mut layers = Vec::new();
    // Deny paths that are missing and that only root could create, before the view copies
    // the mount tree and again after (policy::absent_root_only_denies says why both).
    let absent_before = crate::policy::absent_root_only_denies(&policy.fs);
    // Namespaces first: the view's private tmpfs roots get Landlock rules below.
    let (view, ownership) = view_layer::prepare_namespaces(k, policy, &mut layers)?;
    // With the view's mount namespace (private propagation), a secret mounted at a missing
    // deny path later never appears in it: nothing there to split a grant around, and /etc
    // stays one rule instead of one per entry. Without it (degraded), keep every split.
    let unsplit = if view.mnt.is_some() && !absent_before.is_empty() {
        let after = crate::policy::absent_root_only_denies(&policy.fs);
        absent_before.intersection(&after).cloned().collect()
    } else {
        Default::default()
    };
    let dirs = view_layer::ViewRule::of(&view);
    let rest = Layers::prepare(k, policy, cgroup_mode, view.net.is_some(), &unsplit, &dirs)?;
    drop(dirs);
    Ok(rest.into_prepared(k, policy, view, ownership, layers))
}

/// Every layer but the view's namespaces, prepared: what the child enforces, and the rows.
pub(crate) struct Layers {
    pub(super) landlock: Option<landlock::PreparedRuleset>,
    pub(super) landlock_abi: i32,
    pub(super) fs_rules: Vec<(std::path::PathBuf, PathAccess, bool)>,
    pub(super) seccomp: Option<BpfProgram>,
    pub(super) identity: identity::Switch,
    pub(super) cgroups: Option<cgroup::Root>,
    pub(super) rlimits: Vec<rlimits::Rlimit>,
    pub(super) network: decide::Network,
    pub(super) installed: decide::Installed,
    /// Landlock, seccomp and identity, in that order.
    pub(super) rows: Vec<LayerStatus>,
    /// cgroup, memory, cpu and the rlimits: after the ownership row.
    pub(super) limit_rows: Vec<LayerStatus>,
}

impl Layers {
    /// Every layer after the view, for a view that has (`private_net`) a network namespace of
    /// its own, with the deny paths of `unsplit` not split around, and Landlock rules for the
    /// view's private tmpfs roots.
    pub(crate) fn prepare(
        k: &dyn kernel::Kernel,
        policy: &Policy,
        cgroup_mode: Cgroups,
        private_net: bool,
        unsplit: &std::collections::BTreeSet<std::path::PathBuf>,
        dirs: &[view_layer::ViewRule<'_>],
    ) -> Result<Layers, PrepareError> {
        let mut layers = Vec::new();
        let allow_degraded = policy.allow_degraded;
        let network = decide::network(policy.network, private_net);
        let socket_rules = network.socket_rules;

        let (landlock, landlock_abi, fs_rules) =
            landlock_layer(k, policy, unsplit, dirs, network, &mut layers)?;
        super::run_timeline::stamp("sn-landlock");

        let seccomp = if k.seccomp_available() {
            Some(seccomp::build(socket_rules)?)
        } else {
            None
        };
        decide::seccomp_row(
            allow_degraded,
            seccomp.as_ref().map(|p| p.len()),
            &mut layers,
        )?;

        let euid = k.euid();
        let identity = identity::prepare(if euid == 0 { policy.identity } else { None });
        let probe = decide::IdentityProbe {
            euid,
            // Only a supervisor that is not root leaves the child its groups.
            groups: if euid == 0 {
                Vec::new()
            } else {
                k.supplementary_groups()
            },
        };
        decide::identity_row(allow_degraded, policy.identity, &probe, &mut layers)?;
        super::run_timeline::stamp("sn-seccomp-identity");

        // cgroup (pids, memory, tree kill), memory, cpu, rlimits.
        let (cgroups, cg_facts) = match (euid, cgroup_mode) {
            (0, Cgroups::Create) => {
                let root = k.cgroups(cgroup::Want::for_limits(&policy.limits));
                let facts = root.as_ref().map(|r| decide::CgroupFacts {
                    describe: r.describe(),
                    no_memory: r.memory().err().map(String::from),
                    cpu: r.cpu(),
                });
                (root, facts)
            }
            (0, Cgroups::ProbeOnly) => (
                None,
                k.cgroup_offer().map(|p| decide::CgroupFacts {
                    describe: p.describe,
                    no_memory: p.no_memory,
                    cpu: p.cpu,
                }),
            ),
            _ => (None, None),
        };
        let (limit_rows, rl) = decide::limits(
            &policy.limits,
            policy.allow_degraded,
            &decide::LimitsProbe {
                cgroups: cg_facts,
                remount_note: k.remount_note(),
                core_gap: k.core_dumps().gap(),
                target_is_root: matches!(identity.target, Some(id) if id.uid == 0),
            },
        )?;

        super::run_timeline::stamp("sn-cgroups");
        let installed = decide::installed(
            &fs_rules,
            landlock.as_ref().map(|p| (p.network_restricted, p.scoped)),
            socket_rules,
            seccomp.is_some(),
        );
        Ok(Layers {
            landlock,
            landlock_abi,
            fs_rules,
            seccomp,
            identity,
            cgroups,
            rlimits: rl,
            network,
            installed,
            rows: layers,
            limit_rows,
        })
    }

    /// The whole sandbox: `layers` holds the namespace rows already; this adds the other
    /// layers' rows around the ownership row.
    pub(crate) fn into_prepared(
        self,
        k: &dyn kernel::Kernel,
        policy: &Policy,
        view: namespaces::View,
        ownership: ownership::Ownership,
        mut layers: Vec<LayerStatus>,
    ) -> Prepared {
        layers.extend(self.rows);
        layers.push(decide::ownership_row(&ownership));
        layers.extend(self.limit_rows);
        let mut installed = self.installed;
        // Added by each exec in the view (child/mod.rs), where only it can name that root; not
        // one of the path rules prepared here, so listed beside the network and scope rules.
        if view.root && self.landlock.is_some() {
            installed.landlock.push(decide::InstalledRule {
                path: "(view root)".into(),
                access: "list / in each exec's view (it holds only the grants)".into(),
            });
        }
        Prepared {
            landlock: self.landlock,
            seccomp: self.seccomp,
            rlimits: self.rlimits,
            identity: self.identity,
            cgroups: self.cgroups,
            view,
            ownership,
            proc_rule: policy.fs.proc_read,
            layers,
            landlock_abi: self.landlock_abi,
            fs_rules: self.fs_rules,
            supervisor_pid: k.getpid(),
            network: self.network,
            installed,
        }
    }
}

/// The ruleset with the ABI and the path rules as installed (the policy's grants, the view's
/// private tmpfs roots and its own files), and the Landlock rows decided on them.
fn landlock_layer(
    k: &dyn kernel::Kernel,
    policy: &Policy,
    unsplit: &std::collections::BTreeSet<std::path::PathBuf>,
    dirs: &[view_layer::ViewRule<'_>],
    network: decide::Network,
    layers: &mut Vec<LayerStatus>,
) -> Result<LandlockLayer, PrepareError> {
    let support = k.landlock();
    let mut landlock_abi = 0;
    let mut fs_rules = Vec::new();
    let mut landlock = None;
    if let Ok(support) = support.as_ref().copied()
        && support.filesystem
    {
        landlock_abi = support.abi;
        let mut rules =
            expand_grants_skipping(&policy.fs, unsplit).map_err(PrepareError::FsRules)?;
        // The view's own directories are other inodes than any the supervisor can name:
        // granted by the descriptor the view opened on each.
        for t in dirs {
            let Some(fd) = t.fd else { continue };
            let fd = fd.try_clone().map_err(PrepareError::FsRules)?;
            rules.push(FsRule {
                path: t.path.to_path_buf(),
                access: t.access,
                is_dir: true,
                fd: std::sync::Arc::new(fd),
            });
        }
        fs_rules = rules
            .iter()
            .map(|r| (r.path.clone(), r.access, r.is_dir))
            .collect();
        // Those the exec's init adds itself, once it has mounted them.
        fs_rules.extend(
            dirs.iter()
                .filter(|t| t.fd.is_none())
                .map(|t| (t.path.to_path_buf(), t.access, true)),
        );
        landlock = Some(landlock::prepare(&rules, network.socket_rules, support)?);
    }
    decide::landlock_rows(
        policy.allow_degraded,
        &support,
        fs_rules.len(),
        network,
        layers,
    )?;
    Ok((landlock, landlock_abi, fs_rules))
}

/// What [`landlock_layer`] builds: the ruleset, the ABI, the path rules as installed.
type LandlockLayer = (
    Option<landlock::PreparedRuleset>,
    i32,
    Vec<(std::path::PathBuf, PathAccess, bool)>,
);

#[cfg(test)]
#[path = "prepare_tests.rs"]
mod tests;
