//! Every `static` that holds state (outside test modules) is listed, with what it is for and
//! why it is process-wide, in docs/architecture.md's "Process-wide statics" table; this test
//! reads that table and fails on a stateful static it does not list, and on a row whose
//! static is gone.

use std::collections::BTreeSet;
use std::path::Path;

use crate::graph::{self, Tree};
use crate::scan;

/// (file under `src/`, static) of each row of the table: the first two columns, each a
/// `code` span (`` `exec/manager.rs` | `MANAGER` (`OnceLock<Manager>`) ``).
fn listed(doc: &str) -> BTreeSet<(String, String)> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Process-wide statics"))
        .expect("docs/architecture.md has a \"Process-wide statics\" section");
    let code = |cell: &str| cell.split('`').nth(1).map(str::to_string);
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            Some((code(cells.get(1)?)?, code(cells.get(2)?)?))
        })
        .collect()
}

/// (stateful statics the table does not list, as `file: line: NAME`; rows whose static is
/// gone).
fn check(tree: &Tree, doc: &str) -> (Vec<String>, Vec<String>) {
    let table = listed(doc);
    let mut found = BTreeSet::new();
    let mut unlisted = Vec::new();
    for (file, f) in scan::library(tree) {
        for (line, name) in f.statics {
            let key = (file.clone(), name.clone());
            if !table.contains(&key) {
                unlisted.push(format!("src/{file}:{line}: {name}"));
            }
            found.insert(key);
        }
    }
    let stale = table
        .difference(&found)
        .map(|(f, n)| format!("{f}: {n}"))
        .collect();
    (unlisted, stale)
}

#[test]
fn every_stateful_static_is_listed_with_its_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tree = graph::load(&root.join("src"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let (unlisted, stale) = check(&tree, &doc);
    assert!(
        unlisted.is_empty(),
        "statics that hold state and are not in docs/architecture.md's \"Process-wide \
         statics\" table (make them a value passed down, or list them with the reason):\n{}",
        unlisted.join("\n")
    );
    assert!(
        stale.is_empty(),
        "rows of docs/architecture.md's \"Process-wide statics\" table whose static is gone \
         (or moved): {stale:?}"
    );
}

#[test]
fn a_planted_static_outside_the_table_is_caught() {
    let doc = "# x\n\n## Process-wide statics\n\n| File | Static | What | Why |\n|---|---|---|---|\n\
               | `a.rs` | `LISTED` (`AtomicU64`) | x | y |\n| `a.rs` | `GONE` | x | y |\n\n## Next\n\n\
               | `a.rs` | `NOT_A_ROW` | | |\n";
    let tree: Tree = [
        ("lib.rs", "pub mod a;"),
        (
            "a.rs",
            "static LISTED: AtomicU64 = AtomicU64::new(0);\n\
             static TABLE: [u8; 2] = [1, 2];\n\
             pub fn f() { static ONCE: std::sync::OnceLock<u8> = std::sync::OnceLock::new(); }\n\
             thread_local! { static MEMO: std::cell::RefCell<u8> = const { std::cell::RefCell::new(0) }; }\n\
             #[cfg(test)] mod tests { static T: std::sync::Mutex<u8> = std::sync::Mutex::new(0); }",
        ),
    ]
    .iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect();
    let (unlisted, stale) = check(&tree, doc);
    assert_eq!(unlisted, ["src/a.rs:3: ONCE", "src/a.rs:4: MEMO"]);
    assert_eq!(stale, ["a.rs: GONE"]);
}
