//! The import rules of `docs/architecture.md`, read from the source: every `use` tree and every
//! `crate::` / `super::` / `self::` path in `src/` (outside test modules) is an edge from the
//! module that writes it to the module it names. The test fails on an edge that runs up the
//! layer table, and on any circle between modules (two path segments deep: `gateway::session`,
//! `exec::manager`, `policy`).
//!
//! `KNOWN_UPWARD` and `KNOWN_CIRCLES` name what is not fixed yet. They may only shrink: an entry
//! that no longer occurs fails the test too, so it is removed the day it is fixed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crate's top-level modules, lowest first. A module may import its own layer's members and
/// any lower layer's; never a higher one.
const LAYERS: &[&[&str]] = &[
    // The floor: logging, the generated protobuf code, test pause points.
    &["logging", "pause", "proto"],
    // Syscall helpers under policy and sandbox (fd walks, errno, mount API, pidfds).
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

/// `src/gateway/`'s own layers, lowest first; `gateway` is its `mod.rs`.
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

/// Upward edges not fixed yet, as (from, to) units. None are left; a new one is fixed, not
/// listed here.
const KNOWN_UPWARD: &[(&str, &str)] = &[];

/// Circles not broken yet, each as its sorted members. None are left either.
const KNOWN_CIRCLES: &[&[&str]] = &[];

type Module = Vec<String>;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library module with its file, `main.rs` (the binary, above everything) left out.
fn modules() -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeMap<Module, PathBuf>, root: &Path) {
        for entry in std::fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("read src/").path();
            if path.is_dir() {
                walk(&path, out, root);
                continue;
            }
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            // Test modules may use anything; they are not part of the layering.
            if !name.ends_with(".rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut m: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            match m.last().map(String::as_str) {
                Some("main") if m.len() == 1 => continue,
                Some("lib") if m.len() == 1 => m.clear(),
                Some("mod") => {
                    m.pop();
                }
                _ => {}
            }
            out.insert(m, path);
        }
    }
    let mut out = BTreeMap::new();
    let root = src_dir();
    walk(&root, &mut out, &root);
    out
}

/// The text without comments and without the `#[cfg(test)]` module at the end of the file.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        // A crude cut: `//` inside a string literal ends the line early, which can only hide
        // an edge, and no string in src/ holds a path with `crate::` after a `//`.
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`crate::{a, b::{c, d}}`) into its paths.
fn expand_use(tree: &str) -> Vec<String> {
    fn go(prefix: &str, t: &str, out: &mut Vec<String>) {
        let t = t.trim();
        if let Some(open) = t.find('{') {
            let head = &t[..open];
            let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            let mut parts = Vec::new();
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(&inner[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parts.push(&inner[start..]);
            for p in parts.into_iter().filter(|p| !p.trim().is_empty()) {
                go(&format!("{prefix}{}", head.trim()), p, out);
            }
        } else {
            let t = t.split_whitespace().next().unwrap_or(t);
            out.push(format!("{prefix}{t}"));
        }
    }
    let mut out = Vec::new();
    go("", tree, &mut out);
    out
}

/// Every path the code names that starts at `crate`, `super` or `self`.
fn paths_in(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `use` trees, whole (they may be nested and span lines).
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + 4..];
        if before.is_some_and(ident_char) {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let tree = &rest[..end];
        if tree.starts_with("crate::") || tree.starts_with("super::") || tree.starts_with("self::")
        {
            out.extend(expand_use(tree));
        }
    }
    // Paths in expressions and types.
    for root in ["crate::", "super::", "self::"] {
        let mut at = 0;
        while let Some(i) = code[at..].find(root) {
            let start = at + i;
            at = start + root.len();
            if code[..start].chars().next_back().is_some_and(ident_char) {
                continue;
            }
            let end = code[start..]
                .find(|c: char| !(ident_char(c) || c == ':'))
                .map_or(code.len(), |e| start + e);
            out.push(code[start..end].trim_end_matches(':').to_owned());
        }
    }
    out
}

/// The module a path names: its longest prefix that is a module.
fn resolve(from: &Module, path: &str, mods: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut segs = path.split("::").filter(|s| !s.is_empty());
    let mut cur: Module = match segs.next()? {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => {
            let mut m = from.clone();
            m.pop()?;
            m
        }
        _ => return None,
    };
    let mut best = cur.clone();
    for s in segs {
        if s == "super" {
            cur.pop()?;
            best = cur.clone();
            continue;
        }
        cur.push(s.to_owned());
        if mods.contains_key(&cur) {
            best = cur.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// The unit an import is judged at: two segments deep.
fn unit(m: &Module) -> String {
    if m.is_empty() {
        return "crate".into();
    }
    m.iter().take(2).cloned().collect::<Vec<_>>().join("::")
}

/// Every edge between units, with one place that writes it (for the failure message).
fn edges() -> BTreeMap<(String, String), String> {
    let mods = modules();
    let mut out = BTreeMap::new();
    for (m, file) in &mods {
        let code = code_of(&std::fs::read_to_string(file).expect("read a source file"));
        for p in paths_in(&code) {
            let Some(target) = resolve(m, &p, &mods) else {
                continue;
            };
            let (a, b) = (unit(m), unit(&target));
            // A parent naming its own child (`mod.rs` wiring its files) is not a dependency
            // that can close a circle; the child naming the parent is.
            if a == b || b.starts_with(&format!("{a}::")) || a == "crate" {
                continue;
            }
            let rel = file.strip_prefix(src_dir()).unwrap().display().to_string();
            out.entry((a, b)).or_insert(format!("src/{rel}: {p}"));
        }
    }
    out
}

fn rank(table: &[&[&str]], name: &str) -> Option<usize> {
    table.iter().position(|layer| layer.contains(&name))
}

/// The (table, rank) of a unit: a top-level module's rank, or for `gateway::x` its rank in
/// the gateway's own table.
fn layer_of(unit: &str) -> (Option<usize>, Option<usize>) {
    let mut it = unit.split("::");
    let top = it.next().unwrap_or("");
    let sub = it.next();
    let inner = if top == "gateway" {
        rank(GATEWAY_LAYERS, sub.unwrap_or(""))
    } else {
        None
    };
    (rank(LAYERS, top), inner)
}

#[test]
fn every_module_is_in_the_layer_table() {
    let mut missing = Vec::new();
    for m in modules().keys() {
        let Some(top) = m.first() else { continue };
        if rank(LAYERS, top).is_none() {
            missing.push(top.clone());
        }
        if top == "gateway" && rank(GATEWAY_LAYERS, m.get(1).map_or("", String::as_str)).is_none() {
            missing.push(m.join("::"));
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "modules in no layer (add them to the table in tests/architecture.rs and \
         docs/architecture.md): {missing:?}"
    );
}

#[test]
fn no_import_runs_up_a_layer() {
    let mut upward = BTreeSet::new();
    let mut lines = Vec::new();
    for ((a, b), at) in edges() {
        let (ta, ga) = layer_of(&a);
        let (tb, gb) = layer_of(&b);
        let top = |u: &str| u.split("::").next().unwrap_or("").to_owned();
        let up = match (ta, tb) {
            (Some(x), Some(y)) if x < y => true,
            // Within the gateway, its own table decides.
            (Some(_), Some(_)) if top(&a) == "gateway" && top(&b) == "gateway" => {
                matches!((ga, gb), (Some(x), Some(y)) if x < y)
            }
            _ => false,
        };
        if up {
            let pair = (top(&a), top(&b));
            let key = if pair.0 == pair.1 {
                (a.clone(), b.clone())
            } else {
                pair
            };
            upward.insert(key);
            lines.push(format!("{a} -> {b} ({at})"));
        }
    }
    let known: BTreeSet<(String, String)> = KNOWN_UPWARD
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<_> = lines
        .iter()
        .filter(|l| {
            !known.iter().any(|(a, b)| {
                let (x, y) = l.split_once(" -> ").unwrap();
                (x == a || x.starts_with(&format!("{a}::")))
                    && (y.starts_with(&format!("{b} ")) || y.starts_with(&format!("{b}::")))
            })
        })
        .collect();
    assert!(
        new.is_empty(),
        "imports that run up the layers (docs/architecture.md):\n{}",
        new.iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let stale: Vec<_> = known.difference(&upward).collect();
    assert!(
        stale.is_empty(),
        "KNOWN_UPWARD lists edges that no longer exist; remove them: {stale:?}"
    );
}

/// Tarjan's strongly connected components with more than one member.
fn circles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        graph.entry(a).or_default().push(b);
        graph.entry(b).or_default();
    }
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(v: &'a str, g: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        for &w in &g[v] {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let l = s.low[v].min(s.low[w]);
                s.low.insert(v, l);
            } else if s.on.contains(w) {
                let l = s.low[v].min(s.index[w]);
                s.low.insert(v, l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, &graph, &mut s);
        }
    }
    s.out.sort();
    s.out
}

#[test]
fn no_import_circle() {
    let all = edges();
    let found = circles(&all.keys().cloned().collect());
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    let new: Vec<String> = found
        .iter()
        .filter(|c| !known.contains(c))
        .map(|c| {
            let why: Vec<String> = all
                .iter()
                .filter(|((a, b), _)| c.contains(a) && c.contains(b))
                .map(|((a, b), at)| format!("    {a} -> {b} ({at})"))
                .collect();
            format!("  {}\n{}", c.join(", "), why.join("\n"))
        })
        .collect();
    assert!(
        new.is_empty(),
        "import circles (docs/architecture.md):\n{}",
        new.join("\n")
    );
    let stale: Vec<_> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(
        stale.is_empty(),
        "KNOWN_CIRCLES lists circles that no longer exist; remove them: {stale:?}"
    );
}

#[test]
fn the_reader_sees_use_trees_and_relative_paths() {
    assert_eq!(
        expand_use("crate::{a, b::{c, d as e}}"),
        ["crate::a", "crate::b::c", "crate::b::d"]
    );
    let code = "use super::x::Y;\nfn f() { crate::exec::run(); let z = self::q; }";
    assert_eq!(
        paths_in(code),
        ["super::x::Y", "crate::exec::run", "super::x::Y", "self::q"]
    );
    let mods: BTreeMap<Module, PathBuf> = [
        vec![],
        vec!["gateway".to_owned()],
        vec!["gateway".to_owned(), "tls".to_owned()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let from = vec!["gateway".to_owned(), "channel".to_owned()];
    assert_eq!(
        resolve(&from, "super::tls::TlsError", &mods),
        Some(vec!["gateway".to_owned(), "tls".to_owned()])
    );
    assert_eq!(
        resolve(&from, "crate::gateway::Thing", &mods),
        Some(vec!["gateway".to_owned()])
    );
}
