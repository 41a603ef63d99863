//! openshell-sandbox: the supervisor that runs inside every sandbox pod.
//!
//! - `policy`: what a sandboxed command may do, as plain data.
//! - `sandbox`: one module per isolation layer; `sandbox::prepare` builds every kernel object
//!   while privileged, and the child enforces them in a fixed order just before exec.
//! - `exec`: the parent side: spawn, stream, time out, kill the tree, build the exit report.
//! - `gateway`: the mTLS dial-back to the OpenShell gateway and the SSH exec server behind it.
//! - `install`: copy-to-hostPath for the node-installer DaemonSet.
//! - `egress`: the per-sandbox egress proxy that enforces `network_policies`.
//! - `manual`: the whole command tree, for shell completions and man pages.

pub mod certs;
pub mod check;
pub mod cli;
pub mod egress;
pub mod exec;
pub mod exit;
pub mod gateway;
pub mod install;
pub mod logging;
pub mod manual;
pub mod pause;
pub mod policy;
pub mod proto;
pub mod sandbox;
pub mod sys;
