//! Polling until a condition holds ([`wait_for`], [`poll_for`]); re-exported at the crate root.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 100 ms until it returns `Some`, and returns that value.
///
/// # Panics
/// When `timeout` passes first.
pub async fn wait_for<T, F, Fut>(timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_for(timeout, check)
        .await
        .unwrap_or_else(|| panic!("condition not met within {timeout:?}"))
}

/// Polls `check` every 100 ms until it returns `Some`, and returns that value; `None` once
/// `timeout` has passed (for a test that collects failures instead of panicking on the first).
pub async fn poll_for<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
