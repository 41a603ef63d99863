//! TLS interception for a sandbox (`docs/egress.md`, "L7 inspection"): the CA made in memory
//! when the sandbox starts, its two public files shown by the view at `/etc/openshell-tls`,
//! the children's trust variables, and the proxy's interceptor. If the CA cannot be made, or
//! the view cannot show it, the interceptor refuses every CONNECT but `tls: skip` (503
//! `tls_termination_unavailable`) rather than tunnel it uninspected, as OpenShell does.

use std::path::Path;
use std::sync::Arc;

use crate::egress::credentials::CredentialStore;
use crate::egress::tls::{self, SandboxCa, Upstream};
use crate::egress::{EventSink, Interceptor};
use crate::policy::ViewFiles;

/// The sandbox's CA (or why there is none) and what the view is to show of it.
pub struct Interception {
    tls: Result<(Arc<SandboxCa>, Arc<Upstream>), String>,
    files: Option<ViewFiles>,
}

impl Interception {
    /// Make the CA (the key stays in this process's memory) and the two public files: the CA
    /// alone, and the first system bundle found followed by the CA.
    pub fn prepare() -> Interception {
        let ca = SandboxCa::generate().map_err(|e| format!("the sandbox CA: {e}"));
        let upstream = Upstream::system().map_err(|e| format!("the upstream trust roots: {e}"));
        let tls = match (ca, upstream) {
            (Ok(ca), Ok(up)) => Ok((Arc::new(ca), Arc::new(up))),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        // Nothing is made on the host: where the host lacks the directory, the view gives it
        // a mount point of its own (sandbox/view_root.rs, `overlay_bind`), or does not show
        // the files, and `unavailable` says why.
        let files = tls.as_ref().ok().map(|(ca, _)| {
            let f = ca.files(Path::new("/"));
            ViewFiles {
                dir: tls::TLS_DIR.into(),
                files: vec![
                    (tls::CA_FILE.into(), f.ca_pem.into_bytes()),
                    (tls::BUNDLE_FILE.into(), f.bundle_pem.into_bytes()),
                ],
            }
        });
        Interception { tls, files }
    }

    /// The files for the view (`NamespacePolicy::files`).
    pub fn view_files(&self) -> Option<ViewFiles> {
        self.files.clone()
    }

    /// Why CONNECTs cannot be intercepted in a sandbox whose view shows its files at `shown`
    /// (`Sandbox::view_files`), or `None` when they can.
    pub fn unavailable(&self, shown: Option<&Path>) -> Option<String> {
        match &self.tls {
            Err(e) => Some(e.clone()),
            Ok(_) if shown == Some(Path::new(tls::TLS_DIR)) => None,
            Ok(_) => Some(format!(
                "the sandbox's view cannot show {} (it needs a view root of its own; where the host lacks the directory, {} must be a read-only grant with no other grant, existing deny path or mount below it, and the kernel must mount a read-only overlay)",
                tls::TLS_DIR,
                Path::new(tls::TLS_DIR)
                    .parent()
                    .unwrap_or(Path::new("/"))
                    .display()
            )),
        }
    }

    /// The interceptor for a sandbox whose view shows the files at `shown`.
    pub fn interceptor(
        &self,
        shown: Option<&Path>,
        store: CredentialStore,
        events: Arc<dyn EventSink>,
    ) -> Interceptor {
        match (&self.tls, self.unavailable(shown)) {
            (Ok((ca, up)), None) => Interceptor::new(ca.clone(), up.clone(), store, events),
            (_, why) => {
                let why = why.unwrap_or_default();
                tracing::warn!(target: "egress", "TLS interception unavailable: {why}; CONNECTs other than tls: skip are refused (503 tls_termination_unavailable)");
                Interceptor::without_ca(why, store, events)
            }
        }
    }

    /// The children's trust variables, when the view shows the files.
    pub fn child_env(&self, shown: Option<&Path>) -> Vec<(&'static str, String)> {
        if self.unavailable(shown).is_none() {
            tls::ca_env(tls::TLS_DIR)
        } else {
            Vec::new()
        }
    }
}
