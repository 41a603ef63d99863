//! A slow reader must slow the child down, not grow the supervisor: output flows through
//! bounded pipes, SSH windows and relay queues.

mod support;

use std::time::Duration;

use openshell_sandbox::proto::v1::exec_sandbox_event::Payload;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_keeps_supervisor_rss_bounded() {
    let (gw, sup) = up(AuthMode::Jwt, SupOpts::default()).await;
    // Warm up so the baseline includes a served exec.
    assert_eq!(gw.sh("echo warm").await.exit, Some(0));
    let baseline = sup.rss_kib();
    const TOTAL: u64 = 128 << 20;
    let req = gw.request(&["sh", "-c", &format!("head -c {TOTAL} /dev/zero")]);
    let mut rx = exec::exec_stream(gw.state.clone(), req).await.unwrap();
    let (mut got, mut peak, mut n) = (0u64, baseline, 0u64);
    let code = loop {
        let ev = rx.recv().await.expect("stream ended without exit").unwrap();
        match ev.payload {
            Some(Payload::Stdout(d)) => got += d.data.len() as u64,
            Some(Payload::Exit(e)) => break e.exit_code,
            _ => {}
        }
        n += 1;
        // A slow consumer: it pauses regularly, so the producer must be held back.
        if n % 8 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            peak = peak.max(sup.rss_kib());
        }
    };
    assert_eq!((code, got), (0, TOTAL));
    let growth = peak.saturating_sub(baseline);
    eprintln!("supervisor RSS: baseline {baseline} KiB, peak {peak} KiB, growth {growth} KiB");
    // Buffering the output would need 128 MiB; the bounded path needs a few MiB.
    assert!(
        growth < 48 * 1024,
        "RSS grew by {growth} KiB while a slow reader drained 128 MiB"
    );
}
