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
    /// Why the view cannot show the files, when it cannot.
    unshown: Option<String>,
}

impl Interception {
    /// Make the CA (the key stays in this process's memory) and the two public files: the CA
    /// alone, and the first system bundle found followed by the CA. Where the view binds
    /// `/etc` from the host, `/etc/openshell-tls` must exist there as the mount point of the
    /// files' tmpfs: it is created (empty, root's, 0755) when it is missing and we may.
    pub fn prepare() -> Interception {
        let ca = SandboxCa::generate().map_err(|e| format!("the sandbox CA: {e}"));
        let upstream = Upstream::system().map_err(|e| format!("the upstream trust roots: {e}"));
        let tls = match (ca, upstream) {
            (Ok(ca), Ok(up)) => Ok((Arc::new(ca), Arc::new(up))),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        let (files, unshown) = match &tls {
            Ok((ca, _)) => match mount_point(Path::new(tls::TLS_DIR)) {
                Ok(()) => {
                    let f = ca.files(Path::new("/"));
                    let files = ViewFiles {
                        dir: tls::TLS_DIR.into(),
                        files: vec![
                            (tls::CA_FILE.into(), f.ca_pem.into_bytes()),
                            (tls::BUNDLE_FILE.into(), f.bundle_pem.into_bytes()),
                        ],
                    };
                    (Some(files), None)
                }
                Err(e) => (None, Some(e)),
            },
            Err(_) => (None, None),
        };
        Interception {
            tls,
            files,
            unshown,
        }
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
            Ok(_) => Some(self.unshown.clone().unwrap_or_else(|| {
                format!(
                    "the sandbox's view cannot show {} (it needs a view root of its own)",
                    tls::TLS_DIR
                )
            })),
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

/// Make `dir` the files' mount point where the host's tree holds it: nothing to do when it
/// exists as a directory or its parent does not exist (the view makes it in its own root).
fn mount_point(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => return Err(format!("{} exists and is not a directory", dir.display())),
        Err(_) => {}
    }
    let parent = dir.parent().unwrap_or(Path::new("/"));
    if std::fs::symlink_metadata(parent).is_err() {
        return Ok(());
    }
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!(
            "{d} is missing on the host and cannot be made as the mount point of the sandbox CA's files ({e}); create it once (`mkdir -m 0755 {d}`)",
            d = dir.display()
        )),
    }
}
