//! Exec through the real binary and a faithful test gateway (mTLS, sandbox JWT).

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_stderr_and_exit_code() {
    let (gw, _sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    let r = gw.sh("echo out; echo err >&2; exit 7").await;
    assert_eq!(r.status.as_ref().map(|s| s.to_string()), None, "{r:?}");
    assert_eq!(r.out(), "out\n");
    assert_eq!(r.err(), "err\n");
    assert_eq!(r.exit, Some(7));
}
