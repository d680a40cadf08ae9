//! A relay's own measurements, exposed in the OpenMetrics text format (what
//! Prometheus scrapes) by `huddle relay --metrics ADDR` (plan 0055).
//!
//! Built on `prometheus-client`: its [`Registry`] is a value, so several relays in one
//! process (`huddle demo`, the simulations) each keep their own counts. Every labelled
//! series is created when the relay starts and kept as a handle, so recording is an
//! atomic add on the relay's hot path (a histogram observation takes the histogram's
//! own short mutex); nothing here is held across an `.await`.
//!
//! ```
//! let metrics = huddle_relay::RelayMetrics::new("r0");
//! metrics.turn_started(huddle_relay::metrics::WorkKind::Task);
//! let text = metrics.encode();
//! assert!(text.contains("huddle_relay_turns_started_total{relay=\"r0\",work=\"task\"} 1"));
//! assert!(text.ends_with("# EOF\n"));
//! ```

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The content type of [`RelayMetrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a claim key elects, as the metrics label it (`kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimKind {
    /// `reply/...`: who answers a message.
    Reply,
    /// `task/...`: who owns a task.
    Task,
    /// `review/...`: who reviews a submitted task.
    Review,
    /// `drive/...`, `taskdrive/...`, `reviewdrive/...`: which relay drives the turn.
    Drive,
    /// Any other key (resources, leases, the relay's own).
    Other,
}

impl ClaimKind {
    const ALL: [ClaimKind; 5] = [
        ClaimKind::Reply,
        ClaimKind::Task,
        ClaimKind::Review,
        ClaimKind::Drive,
        ClaimKind::Other,
    ];

    /// The kind of claim `key` is, by its first part (the key shapes of
    /// [`ClaimKey`](huddle_core::sync::ClaimKey); no parse, no allocation: this is on
    /// the relay's hot path).
    pub fn of(key: &str) -> ClaimKind {
        match key.split('/').next() {
            Some("reply") => ClaimKind::Reply,
            Some("task") => ClaimKind::Task,
            Some("review") => ClaimKind::Review,
            Some("drive" | "taskdrive" | "reviewdrive") => ClaimKind::Drive,
            _ => ClaimKind::Other,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Reply => "reply",
            ClaimKind::Task => "task",
            ClaimKind::Review => "review",
            ClaimKind::Drive => "drive",
            ClaimKind::Other => "other",
        }
    }
}

/// How an acquisition went (`result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireResult {
    /// This relay won it.
    Won,
    /// Someone else holds it.
    Held,
    /// The work is finished: the claim is closed.
    Closed,
    /// The store did not answer.
    Failed,
}

impl AcquireResult {
    const ALL: [AcquireResult; 4] = [
        AcquireResult::Won,
        AcquireResult::Held,
        AcquireResult::Closed,
        AcquireResult::Failed,
    ];

    fn as_str(self) -> &'static str {
        match self {
            AcquireResult::Won => "won",
            AcquireResult::Held => "held",
            AcquireResult::Closed => "closed",
            AcquireResult::Failed => "failed",
        }
    }
}

/// What a turn was for (`work`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkKind {
    /// Answering a message.
    Reply,
    /// Working a task.
    Task,
    /// Reviewing a submitted task.
    Review,
}

impl WorkKind {
    const ALL: [WorkKind; 3] = [WorkKind::Reply, WorkKind::Task, WorkKind::Review];

    fn as_str(self) -> &'static str {
        match self {
            WorkKind::Reply => "reply",
            WorkKind::Task => "task",
            WorkKind::Review => "review",
        }
    }
}

/// How a turn ended (`outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnEnd {
    /// The agent answered and the answer is written under the turn's claims.
    Replied,
    /// The agent failed (or stalled, or timed out).
    Failed,
    /// The turn was stopped (a cancel, a lost claim, shutdown).
    Cancelled,
    /// The agent answered after a claim of the turn was lost: nothing is written.
    Lost,
    /// The turn never started (its start deadline passed, its claims could not be
    /// confirmed).
    NotStarted,
}

impl TurnEnd {
    const ALL: [TurnEnd; 5] = [
        TurnEnd::Replied,
        TurnEnd::Failed,
        TurnEnd::Cancelled,
        TurnEnd::Lost,
        TurnEnd::NotStarted,
    ];

    fn as_str(self) -> &'static str {
        match self {
            TurnEnd::Replied => "replied",
            TurnEnd::Failed => "failed",
            TurnEnd::Cancelled => "cancelled",
            TurnEnd::Lost => "lost",
            TurnEnd::NotStarted => "not_started",
        }
    }
}

/// Turn durations, seconds: 10 ms to about 20 minutes.
const TURN_BUCKETS: [f64; 16] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
];
/// Wake latencies, seconds: 100 µs to 10 s.
const WAKE_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0,
];

type Labels2 = [(&'static str, &'static str); 2];
type Labels1 = [(&'static str, &'static str); 1];

/// One relay's metrics. Cheap to clone (every handle shares its series).
#[derive(Clone)]
pub struct RelayMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    /// `[kind][result]`
    acquires: Vec<Vec<Counter>>,
    /// `[kind]`
    lost: Vec<Counter>,
    appends: [Counter; 2],
    appended_rows: Counter,
    fenced_refusals: Counter,
    writes_retried: Counter,
    results_lost: Counter,
    rows_folded: Counter,
    rows_skipped: Counter,
    /// `[work]`
    started: Vec<Counter>,
    /// `[work][outcome]`
    ended: Vec<Vec<Counter>>,
    /// `[work]`
    durations: Vec<Histogram>,
    wake: Histogram,
    outbox: Gauge,
    running: Gauge,
}

impl std::fmt::Debug for RelayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayMetrics").finish_non_exhaustive()
    }
}

fn index<T: PartialEq>(all: &[T], v: T) -> usize {
    all.iter().position(|x| *x == v).unwrap_or(0)
}

impl RelayMetrics {
    /// Fresh metrics for relay `relay` (every series at zero, labelled
    /// `relay="<relay>"`).
    pub fn new(relay: &str) -> RelayMetrics {
        let mut registry = Registry::with_prefix_and_labels(
            "huddle_relay",
            [(
                std::borrow::Cow::Borrowed("relay"),
                std::borrow::Cow::Owned(relay.to_string()),
            )]
            .into_iter(),
        );
        let acquire_family = Family::<Labels2, Counter>::default();
        let acquires = ClaimKind::ALL
            .iter()
            .map(|k| {
                AcquireResult::ALL
                    .iter()
                    .map(|r| {
                        acquire_family
                            .get_or_create_owned(&[("kind", k.as_str()), ("result", r.as_str())])
                    })
                    .collect()
            })
            .collect();
        registry.register(
            "claim_acquires",
            "Claim acquisitions this relay asked for, by the claim's kind and the answer \
             (won; held by another; closed: the work is finished; failed: no answer)",
            acquire_family,
        );
        let lost_family = Family::<Labels1, Counter>::default();
        let lost = ClaimKind::ALL
            .iter()
            .map(|k| lost_family.get_or_create_owned(&[("kind", k.as_str())]))
            .collect();
        registry.register(
            "claims_lost",
            "Claims this relay held and lost: a renewal found another holder, or a fenced \
             write was refused",
            lost_family,
        );
        let append_family = Family::<Labels1, Counter>::default();
        let appends = [
            append_family.get_or_create_owned(&[("fenced", "false")]),
            append_family.get_or_create_owned(&[("fenced", "true")]),
        ];
        registry.register(
            "appends",
            "Batches this relay appended to the ledger (fenced: under claims)",
            append_family,
        );
        let appended_rows = Counter::default();
        registry.register(
            "appended_rows",
            "Rows in the batches this relay appended",
            appended_rows.clone(),
        );
        let fenced_refusals = Counter::default();
        registry.register(
            "fenced_refusals",
            "Fenced appends the database refused: a claim they were written under was lost",
            fenced_refusals.clone(),
        );
        let writes_retried = Counter::default();
        registry.register(
            "writes_retried",
            "Outbox writes that failed because the database was away and were retried",
            writes_retried.clone(),
        );
        let results_lost = Counter::default();
        registry.register(
            "results_lost",
            "Results given up unwritten (refused for good, or the shutdown grace ended)",
            results_lost.clone(),
        );
        let rows_folded = Counter::default();
        registry.register(
            "rows_folded",
            "Ledger rows this relay read forward and folded",
            rows_folded.clone(),
        );
        let rows_skipped = Counter::default();
        registry.register(
            "rows_skipped",
            "Ledger rows skipped as corrupt or foreign (failed verification)",
            rows_skipped.clone(),
        );
        let started_family = Family::<Labels1, Counter>::default();
        let started = WorkKind::ALL
            .iter()
            .map(|w| started_family.get_or_create_owned(&[("work", w.as_str())]))
            .collect();
        registry.register(
            "turns_started",
            "Agent turns this relay started, by what they were for",
            started_family,
        );
        let ended_family = Family::<Labels2, Counter>::default();
        let ended = WorkKind::ALL
            .iter()
            .map(|w| {
                TurnEnd::ALL
                    .iter()
                    .map(|o| {
                        ended_family
                            .get_or_create_owned(&[("work", w.as_str()), ("outcome", o.as_str())])
                    })
                    .collect()
            })
            .collect();
        registry.register(
            "turns_ended",
            "Agent turns that ended, by what they were for and how they ended",
            ended_family,
        );
        let duration_family =
            Family::<Labels1, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(TURN_BUCKETS)
            });
        let durations = WorkKind::ALL
            .iter()
            .map(|w| duration_family.get_or_create_owned(&[("work", w.as_str())]))
            .collect();
        registry.register(
            "turn_duration_seconds",
            "How long turns ran, from their start to their end (turns that never started \
             are not counted)",
            duration_family,
        );
        let wake = Histogram::new(WAKE_BUCKETS);
        registry.register(
            "wake_latency_seconds",
            "From the doorbell (NOTIFY, or the SQLite change watcher) waking the reader to \
             the rows it read reaching the event loop",
            wake.clone(),
        );
        let outbox = Gauge::default();
        registry.register(
            "outbox_depth",
            "Writes in the outbox now: being appended, or retrying while the database is away",
            outbox.clone(),
        );
        let running = Gauge::default();
        registry.register("turns_running", "Turns running now", running.clone());
        RelayMetrics {
            inner: Arc::new(Inner {
                registry,
                acquires,
                lost,
                appends,
                appended_rows,
                fenced_refusals,
                writes_retried,
                results_lost,
                rows_folded,
                rows_skipped,
                started,
                ended,
                durations,
                wake,
                outbox,
                running,
            }),
        }
    }

    /// Every series in the OpenMetrics text format, ending in `# EOF`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry) {
            tracing::warn!(error = %e, "cannot encode the relay's metrics");
        }
        out
    }

    /// An acquisition of `key` answered `result`.
    pub fn acquired(&self, key: &str, result: AcquireResult) {
        let k = index(&ClaimKind::ALL, ClaimKind::of(key));
        let r = index(&AcquireResult::ALL, result);
        self.inner.acquires[k][r].inc();
    }

    /// A claim on `key` this relay held was lost; `fenced` when a fenced write found
    /// it gone.
    pub fn claim_lost(&self, key: &str, fenced: bool) {
        self.inner.lost[index(&ClaimKind::ALL, ClaimKind::of(key))].inc();
        if fenced {
            self.inner.fenced_refusals.inc();
        }
    }

    /// A fenced append refused that reports no lost claim (a progress note's).
    pub fn fenced_refusal(&self) {
        self.inner.fenced_refusals.inc();
    }

    /// A batch of `rows` rows appended.
    pub fn appended(&self, rows: usize, fenced: bool) {
        self.inner.appends[usize::from(fenced)].inc();
        self.inner.appended_rows.inc_by(rows as u64);
    }

    /// A write retried while the database was away.
    pub fn write_retried(&self) {
        self.inner.writes_retried.inc();
    }

    /// A result given up unwritten.
    pub fn result_lost(&self) {
        self.inner.results_lost.inc();
    }

    /// Rows read forward: `folded` verified rows, `skipped` failed verification.
    pub fn read(&self, folded: usize, skipped: usize) {
        self.inner.rows_folded.inc_by(folded as u64);
        self.inner.rows_skipped.inc_by(skipped as u64);
    }

    /// The doorbell woke the reader `latency` before its rows reached the loop.
    pub fn woke(&self, latency: Duration) {
        self.inner.wake.observe(latency.as_secs_f64());
    }

    /// A turn started.
    pub fn turn_started(&self, work: WorkKind) {
        self.inner.started[index(&WorkKind::ALL, work)].inc();
        self.inner.running.inc();
    }

    /// A turn started by [`RelayMetrics::turn_started`] ended after running `ran`
    /// (`None`: it never started).
    pub fn turn_ended(&self, work: WorkKind, outcome: TurnEnd, ran: Option<Duration>) {
        let w = index(&WorkKind::ALL, work);
        self.inner.ended[w][index(&TurnEnd::ALL, outcome)].inc();
        self.inner.running.dec();
        if let Some(ran) = ran {
            self.inner.durations[w].observe(ran.as_secs_f64());
        }
    }

    /// A write entered the outbox; it leaves when the guard drops.
    pub fn outbox_entry(&self) -> OutboxEntry {
        self.inner.outbox.inc();
        OutboxEntry(self.inner.outbox.clone())
    }
}

/// Counts one write in the outbox while it lives.
pub struct OutboxEntry(Gauge);

impl Drop for OutboxEntry {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_exist_from_the_start_and_move() {
        let m = RelayMetrics::new("r\"1");
        let text = m.encode();
        // Every labelled series is there at zero, the relay's name escaped.
        assert!(
            text.contains(
                "huddle_relay_claim_acquires_total{relay=\"r\\\"1\",kind=\"task\",result=\"won\"} 0"
            ),
            "{text}"
        );
        assert!(text.contains("huddle_relay_turn_duration_seconds_bucket{"));
        assert!(text.contains("huddle_relay_wake_latency_seconds_count{relay=\"r\\\"1\"} 0"));
        m.acquired("task/room/t1", AcquireResult::Won);
        m.acquired("taskdrive/room/t1", AcquireResult::Held);
        m.turn_started(WorkKind::Task);
        m.turn_ended(
            WorkKind::Task,
            TurnEnd::Replied,
            Some(Duration::from_millis(30)),
        );
        {
            let _entry = m.outbox_entry();
            assert!(m
                .encode()
                .contains("huddle_relay_outbox_depth{relay=\"r\\\"1\"} 1"));
        }
        let text = m.encode();
        assert!(text.contains("kind=\"task\",result=\"won\"} 1"), "{text}");
        assert!(text.contains("kind=\"drive\",result=\"held\"} 1"), "{text}");
        assert!(
            text.contains("work=\"task\",outcome=\"replied\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "huddle_relay_turn_duration_seconds_count{relay=\"r\\\"1\",work=\"task\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("huddle_relay_outbox_depth{relay=\"r\\\"1\"} 0"));
        assert!(text.contains("huddle_relay_turns_running{relay=\"r\\\"1\"} 0"));
    }

    #[test]
    fn claim_kinds() {
        use huddle_core::sync::ClaimKey;
        // Every key shape the core makes, by its first part.
        let m = "ab".repeat(32);
        for (key, kind) in [
            (format!("reply/r/{m}"), ClaimKind::Reply),
            (format!("reply/r/{m}/ava"), ClaimKind::Reply),
            (format!("drive/r/ava/{m}"), ClaimKind::Drive),
            ("task/r/t".to_string(), ClaimKind::Task),
            ("task/r/t/2".to_string(), ClaimKind::Task),
            ("taskdrive/r/t".to_string(), ClaimKind::Drive),
            ("review/r/t".to_string(), ClaimKind::Review),
            ("reviewdrive/r/t".to_string(), ClaimKind::Drive),
        ] {
            assert_eq!(ClaimKind::of(&key), kind, "{key}");
            assert!(ClaimKey::parse(&key).is_some(), "{key}");
        }
        assert_eq!(ClaimKind::of("task/r/t"), ClaimKind::Task);
        assert_eq!(ClaimKind::of("relay/r0"), ClaimKind::Other);
        assert_eq!(ClaimKind::of("nonsense"), ClaimKind::Other);
    }
}
