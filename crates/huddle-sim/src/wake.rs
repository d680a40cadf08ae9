//! Wake latency: how long an append on one store handle takes to arrive in a
//! [`Subscription`] on another, on an idle system.

use std::sync::Arc;
use std::time::{Duration, Instant};

use huddle_core::{NewInteraction, Position, Role, Verb};
use huddle_store::{Ledger, StoreOptions, Subscription};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::error::Result;
use crate::report::Percentiles;
use crate::runner::open_handle;

/// Append on one handle → arrival in a [`Subscription`] on another.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WakeReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Probes sent.
    pub samples: usize,
    /// Probes that never arrived within 5 s.
    pub lost: usize,
    /// From the start of the append call to the arrival.
    pub append_to_arrival: Percentiles,
    /// From the append call's return (committed) to the arrival.
    pub commit_to_arrival: Percentiles,
    /// The append call alone.
    pub append: Percentiles,
}

/// Measures wake latency on an idle system: `samples` sequential appends on handle A,
/// `gap` apart, each timed until a subscription on handle B yields it.
pub async fn wake_latency(
    db: &str,
    store: &StoreOptions,
    samples: usize,
    gap: Duration,
) -> Result<WakeReport> {
    let a = open_handle(db, store, "wake-a").await?;
    let b = open_handle(db, store, "wake-b").await?;
    let backend = a.backend_name().to_string();
    let nonce = b.now().await?;
    let room = format!("wake-{nonce}");
    let ledger: Arc<dyn Ledger> = b.clone();
    let mut sub = Subscription::new(ledger, Position::START, 5000);
    loop {
        let batch = sub.poll_once().await?;
        if batch.rows.is_empty() && batch.skipped.is_empty() {
            break;
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let watch_room = room.clone();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let reader = tokio::spawn(async move {
        loop {
            let batch = tokio::select! {
                _ = stopped.cancelled() => return,
                b = sub.next() => b,
            };
            let arrived = Instant::now();
            match batch {
                Ok(batch) => {
                    for r in batch.rows {
                        if r.room != watch_room {
                            continue;
                        }
                        if let Some(n) = r.body.get("probe").and_then(|p| p.as_u64()) {
                            if tx.send((n, arrived)).is_err() {
                                return;
                            }
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %e, "wake probe subscription failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    let mut total = Vec::new();
    let mut after_commit = Vec::new();
    let mut append = Vec::new();
    let mut lost = 0;
    for i in 0..samples as u64 {
        tokio::time::sleep(gap).await;
        let row = NewInteraction::new(
            room.as_str(),
            Verb::MessagePosted,
            "prober",
            Role::System,
            json!({ "text": "wake probe", "probe": i }),
        );
        let t0 = Instant::now();
        a.append(vec![row]).await?;
        let t1 = Instant::now();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut arrived = None;
        while let Ok(Some((n, at))) = tokio::time::timeout_at(deadline, rx.recv()).await {
            if n == i {
                arrived = Some(at);
                break;
            }
        }
        append.push((t1 - t0).as_micros() as i64);
        match arrived {
            Some(at) => {
                total.push(at.saturating_duration_since(t0).as_micros() as i64);
                after_commit.push(at.saturating_duration_since(t1).as_micros() as i64);
            }
            None => lost += 1,
        }
    }
    stop.cancel();
    let _ = reader.await;
    Ok(WakeReport {
        backend,
        samples,
        lost,
        append_to_arrival: Percentiles::of_us(&total),
        commit_to_arrival: Percentiles::of_us(&after_commit),
        append: Percentiles::of_us(&append),
    })
}
