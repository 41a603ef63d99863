//! The README, SECURITY.md and docs/ say what the code does: claims that were true once and no
//! longer are must not come back. Each entry names the page text that went stale and what the
//! code does instead (the behaviour itself is tested where it lives).

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![
        Path::new(ROOT).join("README.md"),
        Path::new(ROOT).join("SECURITY.md"),
    ];
    for e in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            paths.push(p);
        }
    }
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            // One line per paragraph's worth of wrapping: a claim may span a line break.
            (p, text.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

/// (stale text, what is true instead)
const STALE: &[(&str, &str)] = &[
    ("`run` exits 2", "every failure of ours exits 125"),
    ("refused, exit 2", "every failure of ours exits 125"),
    (
        "`run` and `check` refuse (`Resolved::into_enforceable`)",
        "network rules go to the egress proxy",
    ),
    (
        "Egress allow-lists are not enforceable",
        "network rules go to the egress proxy",
    ),
    (
        "today any network rule means all egress is denied",
        "network rules go to the egress proxy",
    ),
    (
        "no egress is allowed",
        "the egress proxy admits what the rules allow",
    ),
    (
        "not even loopback, until the sandbox has its own network namespace",
        "the sandbox has a network namespace with lo",
    ),
    (
        "`HOME` (the workdir), `LANG`",
        "run's HOME is /tmp/home on the view's private /tmp (serve keeps the workdir)",
    ),
    (
        "`LANG` and, with `--scratch`, `TMPDIR`",
        "TMPDIR is always set: /tmp, or the scratch directory",
    ),
    (
        "a directory of your own below it, or `--scratch`",
        "--scratch does not change the workdir; --workdir DIR does",
    ),
    (
        "debug build, `check`",
        "make demo builds the release binary",
    ),
    (
        "Without it only the main process runs",
        "without a gateway serve runs nothing unless --no-gateway",
    ),
    (
        "`/` itself and the directories above a grant cannot be listed",
        "each exec may list the view's root",
    ),
    (
        "Not implemented: the `sftp`",
        "sftp, openshell-main and direct-tcpip are implemented",
    ),
    (
        "Not implemented: the `openshell-main` subsystem",
        "sftp, openshell-main and direct-tcpip are implemented",
    ),
    (
        "(the sandbox never runs as root)",
        "a --uid 0 sandbox is root: for it, only a read-only mount vouches for a mapped file",
    ),
    (
        "a process that did not make the connection cannot lend it an identity",
        "a request written before the proxy looks is the holders' (SECURITY.md, known gap)",
    ),
];

#[test]
fn no_page_repeats_a_stale_claim() {
    let mut found = Vec::new();
    for (path, text) in pages() {
        for (stale, truth) in STALE {
            if text.contains(stale) {
                found.push(format!("{}: `{stale}` ({truth})", path.display()));
            }
        }
    }
    assert!(found.is_empty(), "stale claims:\n{}", found.join("\n"));
}

/// What the first hour meets is written down where a new user looks.
#[test]
fn the_readme_says_what_run_and_serve_do_by_default() {
    let readme = &pages()[0].1;
    for claim in [
        "`TMPDIR` is `/tmp`",
        "`/tmp/home`",
        "`--no-gateway`",
        "refused, exit 125, when it is a home directory",
    ] {
        assert!(readme.contains(claim), "README.md does not say {claim}");
    }
}
