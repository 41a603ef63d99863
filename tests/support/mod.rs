//! The one test support module: every integration test, and `benches/gateway.rs`, mounts it
//! with `mod support;` (at the crate root: its files name each other `crate::support::..`).
//! By subject:
//! - `skip`: skipping loudly when root, a tool or a kernel feature is absent (a failure under
//!   `CI=true`);
//! - `run`: the real binary's `run`, its workdir and report, pause points, waits;
//! - `serve`: the supervisor against a faithful test gateway (`gateway`, served by
//!   `listener`), with `connect`, `exec`, `jwt`, `pki`, `plane`, `ssh_bridge`, and
//!   `raw_gateway` (a gRPC server that puts any bytes on a stream);
//! - `egress`: the egress tests' world (namespaces, upstreams, the proxy, hostile children);
//! - `fuzz`: the property harnesses' runner, corpus and models;
//! - `probe`: the escape probe (C) and its harness, for the escapes_* suites.
//!
//! What `skip`, `run` and `serve` hold is also reachable from here (`support::require_root`).
#![allow(dead_code)]

pub mod connect;
pub mod egress;
pub mod exec;
pub mod fuzz;
pub mod gateway;
pub mod jwt;
pub mod listener;
pub mod pki;
pub mod plane;
pub mod probe;
pub mod raw_gateway;
pub mod run;
pub mod serve;
pub mod skip;
pub mod ssh_bridge;

#[allow(unused_imports)]
pub use run::*;
#[allow(unused_imports)]
pub use serve::*;
#[allow(unused_imports)]
pub use skip::*;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_openshell-sandbox");
