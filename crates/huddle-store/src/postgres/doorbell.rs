//! The doorbell: NOTIFY out, LISTEN in, both outside the pool.
//!
//! A NOTIFY is only a hint that rows may be readable; subscribers always read forward
//! from their cursor. So the notifier may coalesce and the listener may miss
//! notifications while it reconnects: after every (re)connect it rings the bell once,
//! and the subscriptions' fallback poll covers the rest.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use super::sql::CHANNEL;

/// Rings a doorbell: every receiver sees a new value.
pub(crate) fn ring(bell: &watch::Sender<u64>) {
    bell.send_modify(|v| *v = v.wrapping_add(1));
}

/// Re-rings the bell, with backoff, while committed rows are held back behind an
/// older running transaction (see `sql::HELD_BACK`): subscribers retry soon after
/// that transaction ends instead of waiting for their fallback poll.
pub(crate) struct Recheck {
    scheduled: AtomicBool,
    delay_us: AtomicU64,
    min: Duration,
    max: Duration,
}

impl Recheck {
    /// A recheck whose delay starts at `min` and doubles up to `max` while rows stay
    /// held back.
    pub(crate) fn new(min: Duration, max: Duration) -> Arc<Self> {
        Arc::new(Recheck {
            scheduled: AtomicBool::new(false),
            delay_us: AtomicU64::new(min.as_micros() as u64),
            min,
            max: max.max(min),
        })
    }

    /// Called after every read: schedules one delayed ring when rows are held back,
    /// resets the backoff when none are.
    pub(crate) fn after_read(self: &Arc<Self>, held_back: bool, bell: &Arc<watch::Sender<u64>>) {
        if !held_back {
            self.delay_us
                .store(self.min.as_micros() as u64, Ordering::Relaxed);
            return;
        }
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let delay = Duration::from_micros(self.delay_us.load(Ordering::Relaxed));
        let next = (delay * 2).min(self.max);
        self.delay_us
            .store(next.as_micros() as u64, Ordering::Relaxed);
        let this = self.clone();
        let bell = bell.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            this.scheduled.store(false, Ordering::Release);
            ring(&bell);
        });
    }
}

/// Least time between two NOTIFYs of one store. The first NOTIFY after a quiet spell
/// goes out at once; under a stream of appends one goes out per gap, covering them
/// all. Every NOTIFY wakes every listening session and its process, so under load a
/// wider gap is fewer wake-ups and reads on every relay: 5 ms handed out tasks about
/// 8 % faster than 2 ms, with no later pickups (docs/benchmarks.md).
const NOTIFY_GAP: Duration = Duration::from_millis(5);

/// The NOTIFY side's shared state: requests counted by appenders, attempts published
/// by the notifier task, so [`Notifier::flush`] can wait for the bell to go out.
pub(crate) struct Notifier {
    wake: Notify,
    requested: AtomicU64,
    attempted: watch::Sender<u64>,
}

impl Notifier {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Notifier {
            wake: Notify::new(),
            requested: AtomicU64::new(0),
            attempted: watch::channel(0).0,
        })
    }

    /// Asks for one NOTIFY after everything committed so far. Never waits.
    pub(crate) fn request(&self) {
        self.requested.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// Waits (at most `timeout`) until a NOTIFY covering every request made before
    /// this call has been attempted.
    pub(crate) async fn flush(&self, timeout: Duration) {
        let target = self.requested.load(Ordering::Acquire);
        let mut done = self.attempted.subscribe();
        let _ = tokio::time::timeout(timeout, done.wait_for(|d| *d >= target)).await;
    }
}

/// Sends `NOTIFY huddle, '<own>'` whenever a NOTIFY is requested, on its own
/// connection (`synchronous_commit = off`, set by its config), never inside an append
/// transaction. `Notify` keeps at most one stored permit, so whatever the append rate
/// there is at most one NOTIFY in flight and one pending, and at most one per
/// `NOTIFY_GAP`.
pub(crate) async fn notify_loop(config: Config, notifier: Arc<Notifier>, own: String) {
    let statement = format!("NOTIFY {CHANNEL}, '{own}'");
    let mut client: Option<Client> = None;
    loop {
        notifier.wake.notified().await;
        // Every request counted up to here is covered by the NOTIFY sent below.
        let covered = notifier.requested.load(Ordering::Acquire);
        // One retry on a fresh connection: the old one may have died since the last
        // bell (server restart). If both fail, readers still poll.
        for _ in 0..2 {
            if client.as_ref().is_none_or(Client::is_closed) {
                client = match config.connect(NoTls).await {
                    Ok((c, connection)) => {
                        tokio::spawn(async move {
                            let _ = connection.await;
                        });
                        Some(c)
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "doorbell: cannot connect to send NOTIFY");
                        None
                    }
                };
            }
            let Some(c) = &client else { break };
            match c.batch_execute(&statement).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "doorbell: NOTIFY failed; reconnecting");
                    client = None;
                }
            }
        }
        notifier.attempted.send_modify(|a| *a = (*a).max(covered));
        // Under a stream of appends, let requests gather for a moment: at most one
        // NOTIFY per gap, at the cost of at most one gap of extra wake latency. A
        // lone append (the loop idle since long) is never delayed.
        tokio::time::sleep(NOTIFY_GAP).await;
    }
}

/// Keeps one LISTEN connection alive and turns notifications into bell rings. After
/// every (re)connect it rings once, so subscribers read forward over anything
/// committed while nobody was listening, and only then reports `listening` true
/// (false again while the connection is down). Reconnects back off from `min` to
/// `max`.
pub(crate) async fn listen_loop(
    config: Config,
    bell: Arc<watch::Sender<u64>>,
    listening: watch::Sender<bool>,
    own: String,
    min: Duration,
    max: Duration,
) {
    let mut backoff = min;
    let mut outage_logged = false;
    loop {
        let end = listen_once(&config, &bell, &listening, &own).await;
        listening.send_replace(false);
        match end {
            ListenEnd::Lost(reason) => {
                tracing::warn!(reason = %reason, "doorbell: LISTEN connection lost; reconnecting");
                outage_logged = true;
                backoff = min;
            }
            ListenEnd::NotConnected(reason) => {
                if !outage_logged {
                    tracing::warn!(reason = %reason, "doorbell: cannot LISTEN; retrying with backoff");
                    outage_logged = true;
                } else {
                    tracing::debug!(reason = %reason, "doorbell: still cannot LISTEN");
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(max);
    }
}

enum ListenEnd {
    /// The connection was listening, then broke.
    Lost(String),
    /// Connecting or LISTEN failed.
    NotConnected(String),
}

async fn listen_once(
    config: &Config,
    bell: &watch::Sender<u64>,
    listening: &watch::Sender<bool>,
    own: &str,
) -> ListenEnd {
    let (client, mut connection) = match config.connect(NoTls).await {
        Ok(pair) => pair,
        Err(e) => return ListenEnd::NotConnected(e.to_string()),
    };
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let on_message = |msg: AsyncMessage| {
        if let AsyncMessage::Notification(n) = msg {
            if n.payload() != own {
                ring(bell);
            }
        }
    };
    {
        let statement = format!("LISTEN {CHANNEL}");
        let listen = client.batch_execute(&statement);
        tokio::pin!(listen);
        loop {
            tokio::select! {
                done = &mut listen => match done {
                    Ok(()) => break,
                    Err(e) => return ListenEnd::NotConnected(e.to_string()),
                },
                msg = messages.next() => match msg {
                    Some(Ok(m)) => on_message(m),
                    Some(Err(e)) => return ListenEnd::NotConnected(e.to_string()),
                    None => return ListenEnd::NotConnected("connection closed".into()),
                },
            }
        }
    }
    tracing::debug!("doorbell: listening");
    // Anything committed while we were not listening is found by reading forward.
    ring(bell);
    listening.send_replace(true);
    let reason = loop {
        match messages.next().await {
            Some(Ok(m)) => on_message(m),
            Some(Err(e)) => break e.to_string(),
            None => break "connection closed".to_string(),
        }
    };
    drop(client);
    ListenEnd::Lost(reason)
}
