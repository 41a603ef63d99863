//! The ownership row: whose ids the writes to the workdir and the `--rw` grants carry.

use super::super::layer::{Enforcement, LayerStatus};
use super::super::ownership::{Ownership, Seen};
use crate::policy::Identity;

/// The report's `ownership` row: whose ids the writes to the read-write grants carry, as
/// `Ownership::decide` found.
pub fn ownership_row(o: &Ownership) -> LayerStatus {
    let id = |i: Identity| format!("{}:{}", i.uid, i.gid);
    let (status, detail) = match o.sandbox {
        None => (
            Enforcement::NotRequested,
            "the command keeps the supervisor's uid, which owns what it writes: no mapping is needed".to_string(),
        ),
        Some(sb) if !o.as_owner => (
            Enforcement::NotRequested,
            format!(
                "the grants are written as the sandbox identity {}, as their modes allow",
                id(sb)
            ),
        ),
        Some(sb) if o.grants.is_empty() => (
            Enforcement::NotRequested,
            format!(
                "the sandbox identity {} owns the workdir and every --rw grant (or it is shared, as /tmp): plain binds",
                id(sb)
            ),
        ),
        Some(sb) => {
            let mut parts = Vec::new();
            let mapped: Vec<String> = o
                .grants
                .iter()
                .filter(|g| g.seen == Seen::Idmapped)
                .map(|g| format!("{} (owner {})", g.path.display(), id(g.owner)))
                .collect();
            if !mapped.is_empty() {
                parts.push(format!(
                    "idmapped, each owner's ids seen as the sandbox's {}, what it writes stored as the owner's, nothing chowned: {}",
                    id(sb),
                    mapped.join(", ")
                ));
            }
            for g in &o.grants {
                let Seen::Refused(why) = &g.seen else {
                    continue;
                };
                let then = match &o.hand_over {
                    Some(h) if h.path == g.path => format!(
                        "handed to {} for the run and back to {} after it",
                        id(h.to),
                        id(h.from)
                    ),
                    _ => format!(
                        "written as {}, as its mode allows (owner {})",
                        id(sb),
                        id(g.owner)
                    ),
                };
                parts.push(format!(
                    "idmapped mount refused for {} ({why}): {then}",
                    g.path.display()
                ));
            }
            let any = !mapped.is_empty() || o.hand_over.is_some();
            let status = if any {
                Enforcement::Enforced
            } else {
                Enforcement::NotRequested
            };
            (status, parts.join("; "))
        }
    };
    LayerStatus {
        layer: "ownership",
        status,
        detail,
    }
}
