//! The import rules of `docs/architecture.md`, read from the source.
//!
//! `graph` parses every library file reached from `src/lib.rs` (with `syn`) and turns every
//! `use` leaf, every path of two or more segments and every `a::b` run inside a macro call into
//! an edge from the file that writes it to the file that defines what it names, following
//! `pub use` re-exports and globs. Test modules are skipped, whether inline
//! (`#[cfg(test)] mod tests { .. }`) or files (`#[cfg(test)] mod tests;`), wherever they sit.
//! `rules` then fails on an edge that runs up a layer table (the crate's, or a top-level
//! module's own), and on a circle among files or among directories at any depth. A parent's
//! `mod.rs` is a file like the others: no import between parent and child is exempt.
//!
//! `KNOWN_UPWARD` and `KNOWN_CIRCLES` name what is not fixed yet. They may only shrink: an entry
//! that no longer occurs fails the test too, so it is removed the day it is fixed.
//!
//! `lengths` measures every function in `src/`: none may run over `lengths::MAX_FN_LINES`
//! lines but those of `KNOWN_LONG`, a list that may only shrink too.
//!
//! `selftest` plants each thing the checker must see in a small tree and shows it is caught.

mod graph;
mod lengths;
mod libc_calls;
mod rules;
mod scan;
mod selftest;
mod statics;

use std::path::Path;
use std::sync::OnceLock;

use rules::{Known, Layers, Verdict};

/// The crate's top-level modules, lowest first. A module may import its own layer's members and
/// any lower layer's; never a higher one.
const LAYERS: &[&[&str]] = &[
    // The floor: logging, the generated protobuf code, test pause points.
    &["exit", "logging", "pause", "proto"],
    // Syscall helpers under policy and sandbox (fd walks, errno, the mount API).
    &["sys"],
    // Plain data and its validation.
    &["policy"],
    // One module per isolation layer, and the child's ordered steps.
    &["sandbox"],
    // The egress proxy: policy's network rules enforced on the sandbox's connections.
    &["egress"],
    // clap definitions shared by the subcommands.
    &["cli"],
    // The parent side of a sandboxed command.
    &["exec"],
    // What uses exec: the local dry run.
    &["check"],
    // The supervisor that serves the gateway.
    &["gateway"],
    // Subcommands that stand alone.
    &["install", "certs"],
    // The whole command tree (completions, man pages).
    &["manual"],
];

/// `src/policy/`'s own layers, lowest first; `""` is its `mod.rs`.
const POLICY_LAYERS: &[&[&str]] = &[
    // The types every part shares (`Identity`, `Limits`, `NetworkMode`), and `PolicyError`.
    &["error", "shared"],
    // The parts of a policy, each plain data with its validation.
    &["flags", "fs", "ipc", "size"],
    // `Policy`, and the re-exports of the parts.
    &[""],
    // The OpenShell policy format, mapped onto `Policy`.
    &["openshell"],
    // The network rules, compiled from the format's `network_policies`.
    &["network"],
];

/// `src/sandbox/`'s own layers, lowest first; `""` is its `mod.rs`.
const SANDBOX_LAYERS: &[&[&str]] = &[
    // What every layer names: the child's steps and their error; the stamps of `run`'s
    // steps, which every layer of its path takes.
    &["run_timeline", "step"],
    // One module per isolation layer, and the helpers they share (a granted path, the
    // diagnosis of a failed exec, /dev/null, the mount table).
    &[
        "cgroup",
        "cgroup_remount",
        "devnull",
        "diagnose",
        "grant",
        "identity",
        "idmap",
        "landlock",
        "mountinfo",
        "namespaces",
        "rlimits",
        "seccomp",
        "view_links",
        "view_root",
    ],
    // What a layer's row is made of, and the error that refuses a sandbox.
    &["layer"],
    // What the kernel offers (`Kernel`), and the decisions taken on it once.
    &["decide", "kernel", "ownership", "view_layer"],
    // `Prepared`: every object and row of one sandbox.
    &["prepared"],
    // The child, fork to execve: the one ordered list of steps.
    &["child"],
    // `prepare`: builds every layer in order.
    &["prepare"],
    // `run`'s sandbox, whose exec's init makes the view.
    &["one"],
    // The façade (`mod.rs`): declarations and re-exports only.
    &[""],
];

/// `src/egress/`'s own layers, lowest first; `""` is its `mod.rs`.
const EGRESS_LAYERS: &[&[&str]] = &[
    // Data and parsing: who calls, address checks, the request and the response, the policy
    // handle, events, credential placeholders and the memory their values live in.
    &[
        "addr",
        "credentials",
        "event",
        "identity",
        "prefixed",
        "request",
        "response",
        "revision",
        "secret_mem",
    ],
    // What the proxy looks up or holds: the caller in /proc (the socket by sock_diag, its
    // holders with the sandbox frozen, the code each may run), the sandbox's netns, DNS, the
    // interception CA.
    &[
        "freeze", "holders", "loaded", "netns", "procfs", "proctext", "resolve", "sockdiag", "tls",
    ],
    // The decision on a connection.
    &["decide"],
    // The relays: plain, forward proxy, L7.
    &["forward", "l7", "relay"],
    // The listener.
    &["proxy"],
    // The façade (`mod.rs`).
    &[""],
];

/// `src/exec/`'s own layers, lowest first; `""` is its `mod.rs`.
const EXEC_LAYERS: &[&[&str]] = &[
    // Pieces: the reaper registry, killing the tree, the pty, the streams, the workdir, the
    // report file, how an exec ended and what it used.
    &[
        "credential_flags",
        "egress_error",
        "inner",
        "interception",
        "missing_interpreter",
        "pty",
        "reaper",
        "report_file",
        "spec",
        "stream",
        "tree",
        "home",
        "usage",
        "workdir",
    ],
    // The process manager (it owns the reaper) and the supervisor context that holds it, why
    // a program could not start, and `RunError`.
    &["error", "explain", "manager", "plan", "supervisor"],
    // `Sandbox` and `Child`: spawn, time out, kill.
    &[""],
    // What a run adds around a `Sandbox`: its egress proxy, the exit report.
    &["egress", "one", "report"],
    // The `run` subcommand.
    &["run"],
];

/// `src/gateway/`'s own layers, lowest first; `""` is its `mod.rs`.
const GATEWAY_LAYERS: &[&[&str]] = &[
    // Base: plain data and helpers, no gateway I/O.
    &[
        "backoff",
        "config",
        "ended",
        "identity",
        "main_spec",
        "ocsf",
        "stop",
        "tls",
        "tokens",
    ],
    // RPC: the channel and every call on it.
    &[
        "auth",
        "channel",
        "egress",
        "logpush",
        "policy_plane",
        "policy_slot",
        "session",
    ],
    // What the gateway runs in the sandbox.
    &[
        "exec_service",
        "main_attach",
        "main_process",
        "provider_env",
    ],
    // Protocol adapters onto exec.
    &["relay", "ssh"],
    // The wiring (`mod.rs`).
    &[""],
    // On top: the diagnosis.
    &["doctor"],
];

const TABLES: Layers = Layers {
    top: LAYERS,
    inner: &[
        ("policy", POLICY_LAYERS),
        ("sandbox", SANDBOX_LAYERS),
        ("egress", EGRESS_LAYERS),
        ("exec", EXEC_LAYERS),
        ("gateway", GATEWAY_LAYERS),
    ],
};

/// Upward edges not fixed yet, as (importing file, imported file). A new one is fixed, not
/// listed here.
const KNOWN_UPWARD: &[(&str, &str)] = &[];

/// Circles not broken yet, each as the edges between its members: a file by its module name
/// (`sandbox::decide`, `sandbox` for `sandbox/mod.rs`), a directory cut short with `::*`
/// (`sandbox::child::*` is `child/` whole). Generated by hand from the test's message.
const KNOWN_CIRCLES: &[&[(&str, &str)]] = &[];

/// Functions in `src/` longer than `lengths::MAX_FN_LINES`, not split into named steps yet
/// (`file::Type::name`, see `lengths::FnName`). A new long function is split, not listed here.
const KNOWN_LONG: &[&str] = &[];

const KNOWN: Known = Known {
    upward: KNOWN_UPWARD,
    circles: KNOWN_CIRCLES,
};

fn verdict() -> &'static Verdict {
    static V: OnceLock<Verdict> = OnceLock::new();
    V.get_or_init(|| {
        let tree = graph::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
        rules::check(&tree, &TABLES, &KNOWN)
    })
}

fn lines<T>(items: impl IntoIterator<Item = T>, f: impl Fn(T) -> String) -> String {
    items
        .into_iter()
        .map(|i| format!("  {}", f(i)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first sites of an edge, and how many more there are.
fn sites(at: &[String]) -> String {
    let mut s = at.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if at.len() > 3 {
        s.push_str(&format!(" (and {} more)", at.len() - 3));
    }
    s
}

#[test]
fn every_module_is_in_a_layer() {
    let v = verdict();
    assert!(
        v.unplaced.is_empty(),
        "files the check cannot place (add modules to a table in tests/architecture/main.rs \
         and docs/architecture.md):\n{}",
        lines(&v.unplaced, |u| u.clone())
    );
}

#[test]
fn no_import_runs_up_a_layer() {
    let v = verdict();
    assert!(
        v.new_upward.is_empty(),
        "imports that run up the layers (docs/architecture.md):\n{}",
        lines(&v.new_upward, |k| format!(
            "{} -> {}: {}",
            k.0,
            k.1,
            sites(&v.upward[k])
        ))
    );
    assert!(
        v.stale_upward.is_empty(),
        "KNOWN_UPWARD lists edges that no longer occur; remove them:\n{}",
        lines(&v.stale_upward, |(a, b)| format!("(\"{a}\", \"{b}\")"))
    );
}

#[test]
fn no_import_circle() {
    let v = verdict();
    assert!(
        v.new_circles.is_empty() && v.new_circle_edges.is_empty(),
        "import circles (docs/architecture.md):\n{}\nnew imports inside a known circle:\n{}",
        lines(&v.new_circles, |c| format!(
            "{}\n{}",
            c.join(", "),
            lines(&v.circles[c], |((a, b), at)| format!("  {a} -> {b} ({at})"))
        )),
        lines(&v.new_circle_edges, |(a, b, at)| format!(
            "{a} -> {b} ({at})"
        ))
    );
    assert!(
        v.stale_circles.is_empty() && v.stale_circle_edges.is_empty(),
        "KNOWN_CIRCLES lists circles or edges that no longer occur; remove them (or replace a \
         circle with what is left of it, listed below):\n{}\n{}\nfound now:\n{}",
        lines(&v.stale_circles, |c| format!("{c:?}")),
        lines(&v.stale_circle_edges, |(a, b)| format!(
            "(\"{a}\", \"{b}\")"
        )),
        lines(&v.circles, |(c, inside)| format!(
            "{c:?}\n{}",
            lines(inside.keys(), |(a, b)| format!("  (\"{a}\", \"{b}\"),"))
        ))
    );
}

#[test]
fn no_function_is_too_long() {
    let tree = graph::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let measured = lengths::measure(&tree);
    let long = lengths::long(&measured);
    let new: Vec<_> = long
        .iter()
        .filter(|(f, _)| !KNOWN_LONG.contains(&f.as_str()))
        .collect();
    assert!(
        new.is_empty(),
        "functions over {} lines (split each into named steps):\n{}",
        lengths::MAX_FN_LINES,
        lines(new, |(f, n)| format!("{f}: {n} lines"))
    );
    let stale: Vec<_> = KNOWN_LONG
        .iter()
        .filter(|f| !long.contains_key(**f))
        .collect();
    assert!(
        stale.is_empty(),
        "KNOWN_LONG lists functions that are no longer long (or gone); remove them:\n{}",
        lines(stale, |f| format!(
            "{f}: {}",
            measured
                .get(*f)
                .map_or("gone".to_string(), |n| format!("{n} lines"))
        ))
    );
}
