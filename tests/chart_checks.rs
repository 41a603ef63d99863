//! The Helm chart checks (installer/ci/test_chart.py) from `cargo test`: lint, render each
//! mode, strict offline validation against Kubernetes 1.33, the example Sandbox against our
//! CRD, and the contract assertions. The tools come from installer/ci/setup-tools.sh; when
//! they are absent the check skips loudly, and fails instead under CI=true.

use std::process::Command;

#[test]
fn helm_chart_lints_renders_validates_and_keeps_the_contract() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/installer/ci/check-chart.sh"))
        .output()
        .expect("run installer/ci/check-chart.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => {
            // unittest reports on stderr; keep its summary visible with --nocapture.
            eprintln!(
                "{}",
                stderr.lines().rev().take(3).collect::<Vec<_>>().join("\n")
            );
        }
        Some(77) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("SKIPPED: {}", stderr.trim());
        }
        code => panic!("chart checks failed (exit {code:?})\n{stdout}\n{stderr}"),
    }
}
