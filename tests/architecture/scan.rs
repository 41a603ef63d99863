//! What each library file does outside the import graph, read with `syn`: the raw `libc`
//! functions it calls, and the statics that hold state. Test modules and `#[test]` functions
//! are skipped, as the graph skips them; macro bodies are token runs (`libc :: name (..)`).

use std::collections::BTreeMap;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

use crate::graph::{Crate, Tree, is_cfg_test};

/// One file's findings, each with its line.
#[derive(Debug, Default)]
pub struct Found {
    /// `libc::name(..)`: (line, name).
    pub libc_calls: Vec<(usize, String)>,
    /// A `static` whose type holds state (a once-cell, an atomic, a lock, a cell), a `static
    /// mut`, or a `thread_local!`: (line, name).
    pub statics: Vec<(usize, String)>,
}

/// Every library file (reached from `lib.rs`, test-only files left out) with what it holds;
/// files with nothing are left out. A file `syn` cannot parse is reported by the graph's test.
pub fn library(tree: &Tree) -> BTreeMap<String, Found> {
    let c = Crate::read(tree);
    let mut out = BTreeMap::new();
    for file in c.files.values() {
        if c.test_files.contains(file) {
            continue;
        }
        let Ok(ast) = syn::parse_file(&tree[file]) else {
            continue;
        };
        let mut v = Found::default();
        v.visit_file(&ast);
        if !v.libc_calls.is_empty() || !v.statics.is_empty() {
            out.insert(file.clone(), v);
        }
    }
    out
}

/// Types whose value changes after start-up (or is set once, at run time).
const STATEFUL: &[&str] = &[
    "OnceLock", "OnceCell", "LazyLock", "Lazy", "Atomic", "Mutex", "RwLock", "Cell", "RefCell",
];

fn is_test_fn(attrs: &[syn::Attribute]) -> bool {
    is_cfg_test(attrs) || attrs.iter().any(|a| a.path().is_ident("test"))
}

impl Found {
    fn tokens(&mut self, ts: TokenStream) {
        let tt: Vec<TokenTree> = ts.into_iter().collect();
        for (i, t) in tt.iter().enumerate() {
            match t {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "libc" => {
                    if let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(name)),
                        Some(TokenTree::Group(args)),
                    ) = (tt.get(i + 1), tt.get(i + 2), tt.get(i + 3), tt.get(i + 4))
                        && a.as_char() == ':'
                        && b.as_char() == ':'
                        && args.delimiter() == proc_macro2::Delimiter::Parenthesis
                        && is_function_name(&name.to_string())
                    {
                        self.libc_calls
                            .push((id.span().start().line, name.to_string()));
                    }
                }
                TokenTree::Ident(id) if id == "static" => {
                    // `thread_local! { static NAME: .. }`
                    if let Some(TokenTree::Ident(name)) = tt.get(i + 1) {
                        self.statics
                            .push((name.span().start().line, name.to_string()));
                    }
                }
                _ => {}
            }
        }
    }
}

/// A libc function, not a constant or a type: lower case.
fn is_function_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
}

impl<'a> Visit<'a> for Found {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_test_fn(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !is_test_fn(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_static(&mut self, s: &'a syn::ItemStatic) {
        let ty = type_idents(&s.ty);
        let mutable = matches!(s.mutability, syn::StaticMutability::Mut(_));
        let stateful = ty.iter().any(|i| STATEFUL.iter().any(|t| i.starts_with(t)));
        if !is_cfg_test(&s.attrs) && (mutable || stateful) {
            self.statics
                .push((s.ident.span().start().line, s.ident.to_string()));
        }
        syn::visit::visit_item_static(self, s);
    }

    fn visit_expr_call(&mut self, c: &'a syn::ExprCall) {
        if let syn::Expr::Path(p) = &*c.func
            && p.path.segments.len() == 2
            && p.path.segments[0].ident == "libc"
        {
            let name = p.path.segments[1].ident.to_string();
            if is_function_name(&name) {
                self.libc_calls
                    .push((p.path.segments[0].ident.span().start().line, name));
            }
        }
        syn::visit::visit_expr_call(self, c);
    }

    fn visit_macro(&mut self, m: &'a syn::Macro) {
        let thread_local = m
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "thread_local");
        if thread_local {
            self.tokens(m.tokens.clone());
            return;
        }
        // Only the calls: a `static` inside another macro is no item of ours.
        let before = self.statics.len();
        self.tokens(m.tokens.clone());
        self.statics.truncate(before);
    }
}

/// Every identifier in a type (`std::sync::OnceLock<Option<OwnedFd>>`: std, sync, OnceLock,
/// Option, OwnedFd).
fn type_idents(ty: &syn::Type) -> Vec<String> {
    struct Idents(Vec<String>);
    impl<'a> Visit<'a> for Idents {
        fn visit_ident(&mut self, i: &'a proc_macro2::Ident) {
            self.0.push(i.to_string());
        }
    }
    let mut v = Idents(Vec::new());
    v.visit_type(ty);
    v.0
}
