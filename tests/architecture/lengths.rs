//! Function lengths in `src/`: a function longer than [`MAX_FN_LINES`] is split into named
//! steps a reader can follow. Every function is measured, test functions and methods included,
//! from its `fn` line to its closing brace (doc comments and attributes not counted).
//!
//! `KNOWN_LONG` lists the ones not split yet; like the import lists it may only shrink: a
//! function that is no longer long (or no longer there) fails the test until its entry goes.

use std::collections::BTreeMap;

use syn::spanned::Spanned;
use syn::visit::Visit;

use crate::graph::Tree;

/// The longest a function in `src/` may be, in lines.
pub const MAX_FN_LINES: usize = 150;

/// A function by where it is: `file under src/::Type::name` (`egress/proxy.rs::Conn::run`);
/// a function inside a function is named after both (`a.rs::outer::inner`).
pub type FnName = String;

/// Every function of `tree` with its length in lines.
pub fn measure(tree: &Tree) -> BTreeMap<FnName, usize> {
    let mut out = BTreeMap::new();
    for (file, text) in tree {
        let Ok(parsed) = syn::parse_file(text) else {
            // The import check names a file it cannot parse.
            continue;
        };
        let mut v = Lengths {
            file,
            scope: Vec::new(),
            out: &mut out,
        };
        v.visit_file(&parsed);
    }
    out
}

/// The functions of `measured` over [`MAX_FN_LINES`].
pub fn long(measured: &BTreeMap<FnName, usize>) -> BTreeMap<FnName, usize> {
    measured
        .iter()
        .filter(|(_, n)| **n > MAX_FN_LINES)
        .map(|(f, n)| (f.clone(), *n))
        .collect()
}

struct Lengths<'a> {
    file: &'a str,
    /// The enclosing impl's type, trait or function names.
    scope: Vec<String>,
    out: &'a mut BTreeMap<FnName, usize>,
}

impl Lengths<'_> {
    fn record(&mut self, name: &syn::Ident, sig: &syn::Signature, block: &syn::Block) {
        let first = sig.span().start().line;
        let last = block.span().end().line;
        let mut path = vec![self.file.to_string()];
        path.extend(self.scope.iter().cloned());
        path.push(name.to_string());
        let entry = self.out.entry(path.join("::")).or_insert(0);
        // Two functions of one name in one scope (cfg'd twins): the longer one counts.
        *entry = (*entry).max(last + 1 - first);
    }
}

/// The type an impl block is for, by its last path segment (`Conn` for `impl<T> Conn<T>`).
fn self_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        syn::Type::Reference(r) => self_name(&r.elem),
        _ => "_".to_string(),
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(&f.sig.ident, &f.sig, &f.block);
        self.scope.push(f.sig.ident.to_string());
        syn::visit::visit_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.sig.ident, &f.sig, &f.block);
        self.scope.push(f.sig.ident.to_string());
        syn::visit::visit_impl_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(&f.sig.ident, &f.sig, block);
        }
        self.scope.push(f.sig.ident.to_string());
        syn::visit::visit_trait_item_fn(self, f);
        self.scope.pop();
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.scope.push(self_name(&i.self_ty));
        syn::visit::visit_item_impl(self, i);
        self.scope.pop();
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.scope.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.scope.pop();
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.scope.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.scope.pop();
    }
}
