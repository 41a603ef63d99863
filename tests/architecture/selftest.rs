//! The checker on planted trees: each thing it once could not see is planted in a small crate
//! of its own, and must be caught; a clean tree must pass.

use crate::graph::Tree;
use crate::rules::{Known, Layers, Verdict, check};

const NONE: Known = Known {
    upward: &[],
    circles: &[],
};

const FLAT: Layers = Layers {
    top: &[&["a", "p"]],
    inner: &[],
};

fn tree(files: &[(&str, &str)]) -> Tree {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

fn circles(v: &Verdict) -> Vec<Vec<&str>> {
    v.circles
        .keys()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect()
}

fn upward(v: &Verdict) -> Vec<(&str, &str, Vec<&str>)> {
    v.upward
        .iter()
        .map(|((a, b), at)| {
            (
                a.as_str(),
                b.as_str(),
                at.iter().map(String::as_str).collect(),
            )
        })
        .collect()
}

/// `crate::a::Step` lives in `child/` through the parent's `pub use`: the circle is `child/`
/// and `x`, and the parent that only passes the name on is no part of it.
#[test]
fn a_circle_hidden_by_a_re_export_is_caught() {
    let t = tree(&[
        ("lib.rs", "pub mod a;"),
        (
            "a/mod.rs",
            "pub mod child;\npub mod x;\npub use child::Step;\n",
        ),
        (
            "a/child/mod.rs",
            "mod step;\npub use step::Step;\npub fn run() { super::x::go(); }\n",
        ),
        ("a/child/step.rs", "pub struct Step;\n"),
        (
            "a/x.rs",
            "use crate::a::Step;\npub fn go() -> Option<Step> { None }\n",
        ),
    ]);
    let v = check(&t, &FLAT, &NONE);
    assert_eq!(circles(&v), [["a::child::*", "a::x"]], "{v:#?}");
    assert_eq!(v.new_circles.len(), 1);
}

/// A parent that holds a type its child imports, while it calls the child.
#[test]
fn a_parent_child_circle_is_caught() {
    let t = tree(&[
        ("lib.rs", "pub mod a;"),
        (
            "a/mod.rs",
            "mod decide;\npub struct Policy;\npub fn run() { decide::go(); }\n",
        ),
        ("a/decide.rs", "use super::Policy;\npub fn go() {}\n"),
    ]);
    let v = check(&t, &FLAT, &NONE);
    assert_eq!(circles(&v), [["a", "a::decide"]], "{v:#?}");
}

const LOW_HIGH: Layers = Layers {
    top: &[&["low"], &["high"]],
    inner: &[],
};

/// Code after a `#[cfg(test)] mod tests;` line and after an inline test module is read; the
/// test modules themselves (which may import anything) are not.
#[test]
fn an_upward_import_after_test_modules_is_caught() {
    let t = tree(&[
        ("lib.rs", "pub mod high;\npub mod low;\n"),
        ("high.rs", "pub struct H;\npub fn h() {}\n"),
        (
            "low/mod.rs",
            "#[cfg(test)]\nmod tests;\nmod other;\npub fn f() {}\nfn g() { crate::high::h(); }\n",
        ),
        ("low/tests.rs", "use crate::high::H;\n"),
        (
            "low/other.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::high::H;\n}\n\
             pub fn k() -> Option<crate::high::H> { None }\n",
        ),
    ]);
    let v = check(&t, &LOW_HIGH, &NONE);
    assert_eq!(
        upward(&v),
        [
            (
                "src/low/mod.rs",
                "src/high.rs",
                vec!["src/low/mod.rs:5: crate::high::h"]
            ),
            (
                "src/low/other.rs",
                "src/high.rs",
                vec!["src/low/other.rs:5: crate::high::H"]
            ),
        ],
        "{v:#?}"
    );
    assert!(v.unplaced.is_empty(), "{:?}", v.unplaced);
}

/// A module named through a `use` binding, a path inside a macro call, a `#[path]` file and
/// an inline module: each edge is seen.
#[test]
fn paths_through_bindings_macros_and_path_attributes_are_read() {
    let t = tree(&[
        ("lib.rs", "pub mod high;\npub mod low;\n"),
        ("high.rs", "pub struct H;\npub fn h() -> u8 { 0 }\n"),
        (
            "low/mod.rs",
            "mod a;\n#[path = \"elsewhere.rs\"]\nmod b;\nmod c {\n    pub fn f() { super::super::high::h(); }\n}\n",
        ),
        ("low/a.rs", "use crate::high;\npub fn f() { high::h(); }\n"),
        (
            "low/elsewhere.rs",
            "pub fn f() -> String { format!(\"{}\", crate::high::h()) }\n",
        ),
    ]);
    let v = check(&t, &LOW_HIGH, &NONE);
    let found: Vec<_> = upward(&v).into_iter().flat_map(|(_, _, at)| at).collect();
    assert_eq!(
        found,
        [
            "src/low/a.rs:2: high::h",
            "src/low/elsewhere.rs:1: crate::high::h",
            "src/low/mod.rs:5: super::super::high::h",
        ],
        "{v:#?}"
    );
}

/// Three files three levels deep, in a circle that two-segment units would fold into one.
#[test]
fn a_deep_circle_is_caught() {
    let t = tree(&[
        ("lib.rs", "pub mod p;"),
        ("p/mod.rs", "pub mod q;\n"),
        ("p/q/mod.rs", "pub mod r1;\npub mod r2;\npub mod r3;\n"),
        ("p/q/r1.rs", "pub struct A;\npub fn f(_: super::r2::B) {}\n"),
        ("p/q/r2.rs", "pub struct B;\npub fn f(_: super::r3::C) {}\n"),
        (
            "p/q/r3.rs",
            "pub struct C;\npub fn f(_: crate::p::q::r1::A) {}\n",
        ),
    ]);
    let v = check(&t, &FLAT, &NONE);
    assert_eq!(
        circles(&v),
        [["p::q::r1", "p::q::r2", "p::q::r3"]],
        "{v:#?}"
    );
}

/// `base` reaches `top` (through the façade's re-export) inside `p`'s own table.
#[test]
fn an_upward_import_inside_an_inner_table_is_caught() {
    let layers = Layers {
        top: &[&["p"]],
        inner: &[("p", &[&["base"], &["top"], &[""]])],
    };
    let t = tree(&[
        ("lib.rs", "pub mod p;"),
        ("p/mod.rs", "pub mod base;\npub mod top;\npub use top::T;\n"),
        ("p/base.rs", "pub fn b() -> crate::p::T { crate::p::T }\n"),
        ("p/top.rs", "pub struct T;\n"),
    ]);
    let v = check(&t, &layers, &NONE);
    assert_eq!(
        v.new_upward,
        [("src/p/base.rs".to_owned(), "src/p/top.rs".to_owned())],
        "{v:#?}"
    );
    assert!(v.circles.is_empty(), "{v:#?}");
}

const CLEAN: &[(&str, &str)] = &[
    ("lib.rs", "pub mod high;\npub mod low;\n"),
    (
        "low/mod.rs",
        "mod parts;\npub use parts::Part;\n#[cfg(test)]\nmod tests {\n    use crate::high::H;\n}\n",
    ),
    (
        "low/parts.rs",
        "pub struct Part;\npub fn new() -> Part { Part }\n",
    ),
    (
        "high.rs",
        "use crate::low::{self, Part};\npub struct H(pub Part);\npub fn h() -> H { H(low::Part) }\n",
    ),
];

const CLEAN_LAYERS: Layers = Layers {
    top: &[&["low"], &["high"]],
    inner: &[("low", &[&["parts"], &[""]])],
};

#[test]
fn a_clean_tree_passes() {
    let v = check(&tree(CLEAN), &CLEAN_LAYERS, &NONE);
    assert!(v.unplaced.is_empty(), "{v:#?}");
    assert!(v.upward.is_empty(), "{v:#?}");
    assert!(v.circles.is_empty(), "{v:#?}");
}

/// The known lists may only shrink: an entry that does not occur is reported.
#[test]
fn a_known_exception_that_no_longer_occurs_is_reported() {
    let known = Known {
        upward: &[("src/low/parts.rs", "src/high.rs")],
        circles: &[&[("high", "low::*"), ("low::*", "high")]],
    };
    let v = check(&tree(CLEAN), &CLEAN_LAYERS, &known);
    assert_eq!(
        v.stale_upward,
        [("src/low/parts.rs".to_owned(), "src/high.rs".to_owned())]
    );
    assert_eq!(v.stale_circles, [["high", "low::*"]]);
}

/// A known circle is its edges: one more import between its members is caught, one fewer is
/// reported for removal from the list.
#[test]
fn a_changed_edge_inside_a_known_circle_is_reported() {
    let known = Known {
        upward: &[],
        circles: &[&[
            ("a", "a::decide"),
            ("a", "a::other"),
            ("a::decide", "a"),
            ("a::other", "a"),
            ("a::other", "a::decide"),
        ]],
    };
    let t = tree(&[
        ("lib.rs", "pub mod a;"),
        (
            "a/mod.rs",
            "mod decide;\nmod other;\npub struct P;\npub fn run() { decide::go(); other::go(); }\n",
        ),
        (
            "a/decide.rs",
            "use super::P;\npub fn go() {}\npub fn planted() { super::other::go(); }\n",
        ),
        ("a/other.rs", "use super::P;\npub fn go() {}\n"),
    ]);
    let v = check(&t, &FLAT, &known);
    assert!(v.new_circles.is_empty(), "{v:#?}");
    assert_eq!(
        v.new_circle_edges,
        [(
            "a::decide".to_owned(),
            "a::other".to_owned(),
            "src/a/decide.rs:3: super::other::go".to_owned()
        )]
    );
    assert_eq!(
        v.stale_circle_edges,
        [("a::other".to_owned(), "a::decide".to_owned())]
    );
}

/// A module in no layer, and a file no `mod` declaration reaches.
#[test]
fn an_unplaced_module_and_an_unreached_file_are_reported() {
    let mut t = tree(CLEAN);
    t.insert(
        "lib.rs".into(),
        "pub mod high;\npub mod low;\npub mod odd;\n".into(),
    );
    t.insert("odd.rs".into(), String::new());
    t.insert("low/stray.rs".into(), String::new());
    let v = check(&t, &CLEAN_LAYERS, &NONE);
    assert_eq!(
        v.unplaced,
        [
            "src/odd.rs: `odd` is in no layer",
            "src/low/stray.rs: no `mod` declaration reaches it"
        ]
    );
}

/// Methods, trait defaults and functions inside functions are measured from the `fn` line to
/// the closing brace, each under its own name; the limit itself is allowed.
#[test]
fn function_lengths_name_methods_and_inner_functions() {
    use crate::lengths::{MAX_FN_LINES, long, measure};
    let body = |n: usize| "    let _ = 0;\n".repeat(n - 2);
    let text = format!(
        "/// doc\n#[inline]\nfn at_limit() {{\n{}}}\nstruct S;\nimpl S {{\n    fn new() {{\n{}}}\n}}\n\
         trait T {{\n    fn d(&self) {{\n{}}}\n}}\nfn outer() {{\n    fn inner() {{\n{}}}\n}}\n",
        body(MAX_FN_LINES),
        body(MAX_FN_LINES + 1),
        body(MAX_FN_LINES + 2),
        body(MAX_FN_LINES + 1),
    );
    let measured = measure(&tree(&[("x/a.rs", &text)]));
    assert_eq!(measured["x/a.rs::at_limit"], MAX_FN_LINES);
    let long: Vec<(String, usize)> = long(&measured).into_iter().collect();
    assert_eq!(
        long,
        [
            ("x/a.rs::S::new".to_string(), MAX_FN_LINES + 1),
            ("x/a.rs::T::d".to_string(), MAX_FN_LINES + 2),
            ("x/a.rs::outer".to_string(), MAX_FN_LINES + 3),
            ("x/a.rs::outer::inner".to_string(), MAX_FN_LINES + 1),
        ]
    );
}
