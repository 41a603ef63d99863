//! The stop signal: a `watch` of `bool` that turns true once shutdown begins.

use tokio::sync::watch;

/// Resolves once shutdown begins (or the supervisor is being torn down).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
