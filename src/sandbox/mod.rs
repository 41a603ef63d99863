//! The isolation layers, and the one place that fixes their order.
//!
//! Two phases (style habit 3):
//! - [`prepare`] runs in the supervisor, privileged and multi-threaded: it checks what the kernel
//!   supports, refuses (fails closed) when the policy cannot be fully enforced unless degraded
//!   runs were allowed, and builds every kernel object: the view (namespaces.rs; its mount
//!   namespace has a root of its own holding only the granted paths, view_root.rs, built
//!   first because Landlock then grants the view's private tmpfs roots), the Landlock
//!   ruleset fd, the seccomp program, the rlimit values, the identity, the cgroup.
//!   Landlock stays the access policy; the view's root is defence in depth and closes what
//!   Landlock ABI < 9 cannot see (connect to pathname unix sockets, stat, inotify).
//! - [`child::enforce_in_child`] runs in the forked child between fork and exec. The supervisor
//!   is a multi-threaded tokio process, so after fork only async-signal-safe work is allowed:
//!   no allocation, no locks, no logging. Every step there is a raw syscall on prepared data.
//!   We chose this over re-executing a single-threaded helper because it costs one exec
//!   instead of two (see BENCHMARKS.md).
//!
//! The order of the child's steps, and why each comes where it does, is written once, in
//! child/mod.rs.

pub mod cgroup;
pub mod cgroup_remount;
pub mod child;
pub mod decide;
pub mod devnull;
pub mod diagnose;
pub mod grant;
pub mod identity;
pub mod idmap;
pub mod kernel;
pub mod landlock;
pub mod layer;
pub mod mountinfo;
pub mod namespaces;
pub mod one;
pub mod ownership;
pub mod prepare;
pub mod prepared;
pub mod rlimits;
pub mod run_timeline;
pub mod seccomp;
pub mod step;
mod view_layer;
mod view_links;
pub mod view_root;

// The façade: what the rest of the crate names as `sandbox::..`.
pub use child::{init, process};
pub use layer::{Enforcement, LayerStatus, PrepareError};
pub use prepare::{prepare, prepare_dry, prepare_with};
pub use prepared::Prepared;
pub use seccomp::available as seccomp_available;
pub use step::{ChildError, Step};
