//! Reading the crate with `syn`: which files are modules (following `mod` declarations from
//! `lib.rs`, `#[path]` included), what each module defines and binds with `use`, and every edge
//! from a file to the file that defines what it names.
//!
//! A parser rather than a text scan, because what hid edges before was text: a `use` that
//! re-exports (`pub use child::Step` makes `crate::sandbox::Step` live in `child`), a relative
//! path through a binding (`use super::namespaces; namespaces::enter()`), and test modules that
//! sit near the top of a file. Paths inside macro calls are token streams to `syn`; they are
//! read as `a::b::c` token runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;
use syn::{Attribute, Item, UseTree};

/// A module path under the crate root (`["sandbox", "child", "step"]`); empty for `lib.rs`.
pub type Module = Vec<String>;

/// Source files by their path under `src/` (`"sandbox/mod.rs"`).
pub type Tree = BTreeMap<String, String>;

/// Every `.rs` file under `src`.
pub fn load(src: &Path) -> Tree {
    fn walk(dir: &Path, root: &Path, out: &mut Tree) {
        for entry in std::fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("read src/").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(
                    rel,
                    std::fs::read_to_string(&path).expect("read a source file"),
                );
            }
        }
    }
    let mut out = Tree::new();
    walk(src, src, &mut out);
    out
}

/// One module (a file, or an inline `mod x { .. }` in one) and the names it holds.
struct Scope {
    /// The file-level module whose file holds this module.
    node: Module,
    /// Child modules declared here (test modules left out).
    children: BTreeSet<String>,
    /// Items defined here (types, functions, constants, traits ...).
    items: BTreeSet<String>,
    /// Names bound by module-level `use` items, with the path as written.
    uses: BTreeMap<String, Vec<String>>,
    /// Sources of module-level glob imports.
    globs: Vec<Vec<String>>,
    /// `uses` plus the bindings made inside function bodies: they expand this module's paths.
    local_uses: BTreeMap<String, Vec<String>>,
    /// The module's own items (nested inline modules are scopes of their own).
    body: Vec<Item>,
}

/// The crate as read from a [`Tree`].
pub struct Crate {
    scopes: BTreeMap<Module, Scope>,
    /// File-level modules with their files (under `src/`).
    pub files: BTreeMap<Module, String>,
    /// Files reached only through `#[cfg(test)] mod` declarations.
    pub test_files: BTreeSet<String>,
    /// What could not be read: a file `syn` cannot parse, a declared module without a file.
    pub errors: Vec<String>,
}

/// One import: the file-level module that writes it, the one that defines what it names, and
/// where (`src/file.rs:LINE: path as written`).
pub struct Edge {
    pub from: Module,
    pub to: Module,
    pub at: String,
}

/// What a path lands on.
enum Target {
    /// A module itself (`use super::namespaces;`): no edge until something in it is named.
    Module(Module),
    /// An item defined in the module.
    Item(Module),
    /// A name the reader cannot place (a re-export of another crate's item, a macro): counted
    /// as an edge to the module that holds the name, which can only add edges, never hide one.
    Unknown(Module),
}

/// `#[cfg(test)]` or `#[cfg(all(test, ..))]`.
pub fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Ok(meta) = a.parse_args::<syn::Meta>() else {
            return false;
        };
        match meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(l) if l.path.is_ident("all") => l
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .is_ok_and(|ms| ms.iter().any(|m| m.path().is_ident("test"))),
            _ => false,
        }
    })
}

fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn dir_of(file: &str) -> String {
    match file.rfind('/') {
        Some(i) => file[..=i].to_owned(),
        None => String::new(),
    }
}

/// Where the children of a module in `file` live: beside a `mod.rs`, in a directory of its
/// own beside `name.rs`.
fn child_dir_of(file: &str) -> String {
    if file == "lib.rs" || file.ends_with("/mod.rs") {
        dir_of(file)
    } else {
        format!("{}/", file.trim_end_matches(".rs"))
    }
}

/// One leaf of a `use` tree: the path, the name it binds (None for a glob), and its line.
struct UseLeaf {
    path: Vec<String>,
    bind: Option<String>,
    line: usize,
}

fn use_leaves(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => out.push(leaf(prefix, &n.ident, &n.ident)),
        UseTree::Rename(r) => out.push(leaf(prefix, &r.ident, &r.rename)),
        UseTree::Glob(g) => out.push(UseLeaf {
            path: prefix.clone(),
            bind: None,
            line: g.star_token.spans[0].start().line,
        }),
        UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix, out);
            }
        }
    }
}

fn leaf(prefix: &[String], name: &syn::Ident, bind: &syn::Ident) -> UseLeaf {
    let mut path = prefix.to_vec();
    // `use a::b::{self}` names `a::b` and binds `b`.
    let bind = if name == "self" {
        path.last().cloned().unwrap_or_default()
    } else {
        path.push(name.to_string());
        bind.to_string()
    };
    UseLeaf {
        path,
        bind: Some(bind),
        line: name.span().start().line,
    }
}

fn item_name(item: &Item) -> Option<String> {
    let id = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(id.to_string())
}

/// The `use` items inside function bodies (not those of nested modules).
#[derive(Default)]
struct BlockUses(Vec<UseLeaf>);

impl<'ast> Visit<'ast> for BlockUses {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            use_leaves(&u.tree, &mut Vec::new(), &mut self.0);
        }
    }
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
}

impl Crate {
    /// Reads the library from `lib.rs` down; `main.rs` (the binary, above everything) is not
    /// part of it.
    pub fn read(tree: &Tree) -> Crate {
        let mut c = Crate {
            scopes: BTreeMap::new(),
            files: BTreeMap::new(),
            test_files: BTreeSet::new(),
            errors: Vec::new(),
        };
        if tree.contains_key("lib.rs") {
            c.files.insert(Vec::new(), "lib.rs".into());
            c.load_file(tree, Vec::new(), "lib.rs");
        } else {
            c.errors.push("no src/lib.rs".into());
        }
        c
    }

    fn parse(&mut self, tree: &Tree, file: &str) -> Option<syn::File> {
        match syn::parse_file(&tree[file]) {
            Ok(f) => Some(f),
            Err(e) => {
                let line = e.span().start().line;
                self.errors
                    .push(format!("src/{file}:{line}: cannot parse: {e}"));
                None
            }
        }
    }

    fn load_file(&mut self, tree: &Tree, m: Module, file: &str) {
        if let Some(ast) = self.parse(tree, file) {
            self.load_items(tree, m.clone(), m, file, ast.items, child_dir_of(file));
        }
    }

    /// The file a `mod name;` in `file` points at.
    fn find_mod(
        &mut self,
        tree: &Tree,
        im: &syn::ItemMod,
        file: &str,
        dir: &str,
    ) -> Option<String> {
        let name = im.ident.to_string();
        let candidates = match path_attr(&im.attrs) {
            Some(p) => vec![format!("{}{p}", dir_of(file))],
            None => vec![format!("{dir}{name}.rs"), format!("{dir}{name}/mod.rs")],
        };
        let found = candidates.iter().find(|c| tree.contains_key(*c)).cloned();
        if found.is_none() {
            let line = im.ident.span().start().line;
            self.errors.push(format!(
                "src/{file}:{line}: `mod {name};` has no file: {candidates:?}"
            ));
        }
        found
    }

    fn load_items(
        &mut self,
        tree: &Tree,
        m: Module,
        node: Module,
        file: &str,
        items: Vec<Item>,
        dir: String,
    ) {
        let mut s = Scope {
            node: node.clone(),
            children: BTreeSet::new(),
            items: BTreeSet::new(),
            uses: BTreeMap::new(),
            globs: Vec::new(),
            local_uses: BTreeMap::new(),
            body: Vec::new(),
        };
        for item in items {
            let im = match item {
                Item::Mod(im) => im,
                other => {
                    if let Some(name) = item_name(&other) {
                        s.items.insert(name);
                    }
                    if let Item::Use(u) = &other {
                        let mut leaves = Vec::new();
                        if u.leading_colon.is_none() {
                            use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
                        }
                        for l in leaves {
                            match l.bind {
                                Some(b) => {
                                    s.uses.entry(b).or_insert(l.path);
                                }
                                None => s.globs.push(l.path),
                            }
                        }
                    }
                    s.body.push(other);
                    continue;
                }
            };
            let name = im.ident.to_string();
            let mut sub = m.clone();
            sub.push(name.clone());
            let test = is_cfg_test(&im.attrs);
            match im.content {
                // An inline test module: its body is test code, skipped whole.
                Some(_) if test => {}
                Some((_, content)) => {
                    s.children.insert(name.clone());
                    let sub_dir = format!("{dir}{name}/");
                    self.load_items(tree, sub, node.clone(), file, content, sub_dir);
                }
                None => {
                    let Some(found) = self.find_mod(tree, &im, file, &dir) else {
                        continue;
                    };
                    if test {
                        self.mark_test(tree, &found);
                    } else {
                        s.children.insert(name);
                        self.files.insert(sub.clone(), found.clone());
                        self.load_file(tree, sub, &found);
                    }
                }
            }
        }
        let mut block = BlockUses::default();
        for item in &s.body {
            if !matches!(item, Item::Use(_)) {
                block.visit_item(item);
            }
        }
        s.local_uses = s.uses.clone();
        for l in block.0 {
            if let Some(b) = l.bind {
                s.local_uses.entry(b).or_insert(l.path);
            }
        }
        self.scopes.insert(m, s);
    }

    /// A test file and the files its own `mod` declarations reach.
    fn mark_test(&mut self, tree: &Tree, file: &str) {
        self.test_files.insert(file.to_owned());
        let Some(ast) = self.parse(tree, file) else {
            return;
        };
        let dir = child_dir_of(file);
        for item in &ast.items {
            if let Item::Mod(im) = item {
                if im.content.is_none() {
                    if let Some(f) = self.find_mod(tree, im, file, &dir) {
                        self.mark_test(tree, &f);
                    }
                }
            }
        }
    }

    /// `path` as written in module `m`, from the crate root; None for another crate's path, a
    /// local name or a generic parameter.
    fn absolutize(&self, m: &Module, path: &[String], depth: usize) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let join = |base: &[String], rest: &[String]| {
            let mut v = base.to_vec();
            v.extend_from_slice(rest);
            v
        };
        match first.as_str() {
            "crate" => Some(rest.to_vec()),
            "self" => Some(join(m, rest)),
            "super" => {
                let mut base = m.clone();
                base.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                Some(join(&base, rest))
            }
            "Self" => None,
            name => {
                let s = self.scopes.get(m)?;
                if s.children.contains(name) || s.items.contains(name) {
                    Some(join(m, path))
                } else if let Some(b) = s.local_uses.get(name) {
                    if depth > 16 || b.as_slice() == path {
                        return None;
                    }
                    Some(join(&self.absolutize(m, b, depth + 1)?, rest))
                } else {
                    None
                }
            }
        }
    }

    /// The module that defines what `abs` names, following `use` re-exports and globs.
    fn target(&self, abs: &[String], depth: usize) -> Target {
        let mut cur: Module = Vec::new();
        for (i, seg) in abs.iter().enumerate() {
            let Some(s) = self.scopes.get(&cur) else {
                return Target::Unknown(cur);
            };
            if s.children.contains(seg) {
                cur.push(seg.clone());
                continue;
            }
            if s.items.contains(seg) {
                return Target::Item(cur);
            }
            if depth < 16 {
                if let Some(b) = s.uses.get(seg) {
                    return match self.absolutize(&cur, b, 0) {
                        Some(mut a) => {
                            a.extend_from_slice(&abs[i + 1..]);
                            self.target(&a, depth + 1)
                        }
                        None => Target::Unknown(cur),
                    };
                }
                for g in &s.globs {
                    if let Some(mut a) = self.absolutize(&cur, g, 0) {
                        a.extend_from_slice(&abs[i..]);
                        if let Target::Item(t) = self.target(&a, depth + 1) {
                            return Target::Item(t);
                        }
                    }
                }
            }
            return Target::Unknown(cur);
        }
        Target::Module(cur)
    }

    fn node(&self, m: &Module) -> Module {
        self.scopes
            .get(m)
            .map_or_else(|| m.clone(), |s| s.node.clone())
    }

    /// Every edge between two different files, each site once.
    pub fn edges(&self) -> Vec<Edge> {
        let mut out = Vec::new();
        for (m, s) in &self.scopes {
            let mut refs = Refs::default();
            for item in &s.body {
                refs.visit_item(item);
            }
            let from = s.node.clone();
            let file = &self.files[&from];
            for r in refs.0 {
                let Some(abs) = self.absolutize(m, &r.path, 0) else {
                    continue;
                };
                let to = match self.target(&abs, 0) {
                    // Naming a module in a `use` is no dependency yet; naming it in code is.
                    Target::Module(_) if r.kind == Kind::Use => continue,
                    Target::Module(t) | Target::Item(t) | Target::Unknown(t) => self.node(&t),
                };
                if to != from {
                    let written = r.path.join("::");
                    let glob = if r.kind == Kind::Glob { "::*" } else { "" };
                    let at = format!("src/{file}:{}: {written}{glob}", r.line);
                    out.push(Edge {
                        from: from.clone(),
                        to,
                        at,
                    });
                }
            }
        }
        out
    }

    /// Files under `src/` that are neither a module, nor a test module, nor the binary.
    pub fn unreached(&self, tree: &Tree) -> Vec<String> {
        let modules: BTreeSet<&String> = self.files.values().collect();
        tree.keys()
            .filter(|f| *f != "main.rs" && !modules.contains(f) && !self.test_files.contains(*f))
            .map(|f| format!("src/{f}"))
            .collect()
    }
}

#[derive(PartialEq, Clone, Copy)]
enum Kind {
    Use,
    Glob,
    Code,
}

struct Ref {
    path: Vec<String>,
    kind: Kind,
    line: usize,
}

/// Every path a module's items write: `use` leaves, paths of two or more segments in types,
/// expressions and patterns, and `a::b` runs inside macro calls. Visibilities
/// (`pub(super)`) and attributes name no dependency and are skipped.
#[derive(Default)]
struct Refs(Vec<Ref>);

impl Refs {
    fn tokens(&mut self, ts: TokenStream) {
        let toks: Vec<TokenTree> = ts.into_iter().collect();
        let colons = |i: usize| {
            matches!((toks.get(i), toks.get(i + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                    if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
        };
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) => {
                    let absolute = i >= 2 && colons(i - 2);
                    let mut path = vec![id.to_string()];
                    while colons(i + 1) {
                        let Some(TokenTree::Ident(next)) = toks.get(i + 3) else {
                            break;
                        };
                        path.push(next.to_string());
                        i += 3;
                    }
                    if path.len() >= 2 && !absolute {
                        let line = id.span().start().line;
                        self.0.push(Ref {
                            path,
                            kind: Kind::Code,
                            line,
                        });
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_some() {
            return;
        }
        let mut leaves = Vec::new();
        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for l in leaves {
            let kind = if l.bind.is_some() {
                Kind::Use
            } else {
                Kind::Glob
            };
            self.0.push(Ref {
                path: l.path,
                kind,
                line: l.line,
            });
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() >= 2 && p.leading_colon.is_none() {
            self.0.push(Ref {
                path: p.segments.iter().map(|s| s.ident.to_string()).collect(),
                kind: Kind::Code,
                line: p.segments[0].ident.span().start().line,
            });
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
    fn visit_attribute(&mut self, _: &'ast Attribute) {}
    // A module inside a function body is rare enough to read as part of the function.
    fn visit_item_mod(&mut self, im: &'ast syn::ItemMod) {
        if !is_cfg_test(&im.attrs) {
            syn::visit::visit_item_mod(self, im);
        }
    }
}
