//! The rules, on the edges `graph` reads: no edge up a layer table, no circle at any depth, and
//! the known exceptions that may only shrink.
//!
//! Every file is a unit of its own: a parent `mod.rs` is judged like any other file, so a
//! parent that holds types its children import, while it imports them, is a circle. Circles
//! are looked for at every depth: with modules cut to one segment (`sandbox::*`, the whole
//! directory), to two (`sandbox::child::*`), and so on down to single files.

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::{Crate, Module, Tree};

/// A layer table: top-level modules lowest first, and for some of them a table of their own
/// children (`""` is the parent's own `mod.rs`).
pub struct Layers<'a> {
    pub top: &'a [&'a [&'a str]],
    pub inner: &'a [(&'a str, &'a [&'a [&'a str]])],
}

/// What is not fixed yet.
pub struct Known<'a> {
    /// (importing file, imported file), both as `src/...`.
    pub upward: &'a [(&'a str, &'a str)],
    /// Each circle as the edges between its members (see [`unit`] for how they are written):
    /// a new edge inside a known circle is reported as well as a new circle.
    pub circles: &'a [&'a [(&'a str, &'a str)]],
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Files that could not be read, modules in no layer, files no `mod` reaches.
    pub unplaced: Vec<String>,
    /// Every upward edge as (from file, to file), with the sites that write it.
    pub upward: BTreeMap<(String, String), Vec<String>>,
    /// Upward edges not in the known list.
    pub new_upward: Vec<(String, String)>,
    /// Known upward edges that no longer occur.
    pub stale_upward: Vec<(String, String)>,
    /// Every circle, at every depth, as its sorted members, with the edges between them and
    /// one site of each.
    pub circles: BTreeMap<Vec<String>, BTreeMap<(String, String), String>>,
    /// Circles not in the known list, and edges inside a known circle that it does not list.
    pub new_circles: Vec<Vec<String>>,
    pub new_circle_edges: Vec<(String, String, String)>,
    /// Known circles that no longer occur, and listed edges of a known circle that no longer
    /// occur.
    pub stale_circles: Vec<Vec<String>>,
    pub stale_circle_edges: Vec<(String, String)>,
}

fn rank(table: &[&[&str]], name: &str) -> Option<usize> {
    table.iter().position(|layer| layer.contains(&name))
}

fn inner<'a>(layers: &Layers<'a>, top: &str) -> Option<&'a [&'a [&'a str]]> {
    layers
        .inner
        .iter()
        .find(|(t, _)| *t == top)
        .map(|(_, l)| *l)
}

/// The rank of `m` in its top-level module's own table: the longest name in the table that
/// `m` is or lies under (`child::step` before `child`); `""` is the top's own `mod.rs`.
fn inner_rank(table: &[&[&str]], m: &Module) -> Option<usize> {
    (1..m.len())
        .rev()
        .find_map(|k| rank(table, &m[1..=k].join("::")))
        .or_else(|| (m.len() == 1).then(|| rank(table, "")).flatten())
}

/// Whether an edge from `a` to `b` runs up a table. `lib.rs` (the empty module) only declares
/// the modules: it sits above them all.
fn is_upward(layers: &Layers, a: &Module, b: &Module) -> bool {
    let top_rank = |m: &Module| match m.first() {
        None => Some(layers.top.len()),
        Some(t) => rank(layers.top, t),
    };
    let (Some(ta), Some(tb)) = (top_rank(a), top_rank(b)) else {
        return false;
    };
    if a.first() != b.first() {
        return ta < tb;
    }
    let Some(table) = a.first().and_then(|t| inner(layers, t)) else {
        return false;
    };
    matches!((inner_rank(table, a), inner_rank(table, b)), (Some(x), Some(y)) if x < y)
}

/// The name of `m`'s unit when modules are cut to `depth` segments: a file keeps its module
/// name (`sandbox::decide`, `crate` for lib.rs); a module cut short together with what is
/// below it is written `sandbox::child::*`.
pub fn unit(m: &Module, depth: usize, files: &BTreeMap<Module, String>) -> String {
    if m.is_empty() {
        return "crate".into();
    }
    if m.len() < depth {
        return m.join("::");
    }
    let prefix = &m[..depth];
    let has_below = files
        .keys()
        .any(|k| k.len() > depth && k[..depth] == *prefix);
    if has_below {
        format!("{}::*", prefix.join("::"))
    } else {
        prefix.join("::")
    }
}

/// Tarjan's strongly connected components with more than one member.
pub fn circles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
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
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(v: &'a str, g: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
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

/// Files in no layer of `layers`.
fn unplaced(c: &Crate, tree: &Tree, layers: &Layers) -> Vec<String> {
    let mut out: Vec<String> = c.errors.clone();
    for (m, file) in &c.files {
        let Some(top) = m.first() else { continue };
        if rank(layers.top, top).is_none() {
            out.push(format!("src/{file}: `{top}` is in no layer"));
        } else if let Some(table) = inner(layers, top) {
            if inner_rank(table, m).is_none() {
                let name = m.join("::");
                out.push(format!("src/{file}: `{name}` is in no layer of `{top}`"));
            }
        }
    }
    for f in c.unreached(tree) {
        out.push(format!("{f}: no `mod` declaration reaches it"));
    }
    out
}

/// Reads `tree` and judges it.
pub fn check(tree: &Tree, layers: &Layers, known: &Known) -> Verdict {
    let c = Crate::read(tree);
    let edges = c.edges();
    let file = |m: &Module| format!("src/{}", c.files[m]);
    let mut v = Verdict {
        unplaced: unplaced(&c, tree, layers),
        ..Verdict::default()
    };

    for e in &edges {
        if is_upward(layers, &e.from, &e.to) {
            v.upward
                .entry((file(&e.from), file(&e.to)))
                .or_default()
                .push(e.at.clone());
        }
    }
    let known_up: BTreeSet<(String, String)> = known
        .upward
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    v.new_upward = v
        .upward
        .keys()
        .filter(|k| !known_up.contains(*k))
        .cloned()
        .collect();
    v.stale_upward = known_up
        .into_iter()
        .filter(|k| !v.upward.contains_key(k))
        .collect();

    let depth = c.files.keys().map(Vec::len).max().unwrap_or(0);
    for d in 1..=depth {
        let mut sites: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for e in &edges {
            let (a, b) = (unit(&e.from, d, &c.files), unit(&e.to, d, &c.files));
            if a != b {
                sites.entry((a, b)).or_default().push(e.at.clone());
            }
        }
        for circle in circles(&sites.keys().cloned().collect()) {
            let inside = sites
                .iter()
                .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
                .map(|(k, at)| (k.clone(), at[0].clone()))
                .collect();
            v.circles.entry(circle).or_insert(inside);
        }
    }
    judge_circles(&mut v, known);
    v
}

fn judge_circles(v: &mut Verdict, known: &Known) {
    let mut listed: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for edges in known.circles {
        let edges: BTreeSet<(String, String)> = edges
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let members: BTreeSet<String> = edges
            .iter()
            .flat_map(|(a, b)| [a.clone(), b.clone()])
            .collect();
        listed.insert(members.into_iter().collect(), edges);
    }
    for (members, inside) in &v.circles {
        let Some(known_edges) = listed.get(members) else {
            v.new_circles.push(members.clone());
            continue;
        };
        v.new_circle_edges.extend(
            inside
                .iter()
                .filter(|(e, _)| !known_edges.contains(*e))
                .map(|((a, b), at)| (a.clone(), b.clone(), at.clone())),
        );
        v.stale_circle_edges.extend(
            known_edges
                .iter()
                .filter(|e| !inside.contains_key(*e))
                .cloned(),
        );
    }
    v.stale_circles = listed
        .into_keys()
        .filter(|c| !v.circles.contains_key(c))
        .collect();
}
