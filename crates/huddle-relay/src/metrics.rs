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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

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

/// Upper bounds of [`IdleGaps`]' buckets, microseconds: 25 µs to 10 s, fine enough
/// below 10 ms for the percentiles `huddle bench tasks` reports.
pub const IDLE_BOUNDS_US: [u64; 30] = [
    25, 50, 75, 100, 150, 200, 300, 400, 500, 750, 1_000, 1_500, 2_000, 3_000, 4_000, 5_000, 7_500,
    10_000, 15_000, 20_000, 30_000, 50_000, 75_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];

/// Agents' idle time between two turns on a relay, counted in the buckets of
/// [`IDLE_BOUNDS_US`] (plan 0083): from a turn's driver returning to the same agent's
/// next turn being started, which covers waiting for work, the previous result's
/// write and the next claim. Reported in the relay's summary; `bench tasks` merges
/// the relays' and reports its percentiles as the pickup latency.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleGaps {
    /// `counts[i]`: gaps at most `IDLE_BOUNDS_US[i]` (and above the bound before it);
    /// the one count past the last bound holds the longer gaps. Empty when none.
    pub counts: Vec<u64>,
}

impl IdleGaps {
    /// Counts one gap.
    pub fn observe(&mut self, gap: Duration) {
        let us = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
        let i = IDLE_BOUNDS_US.partition_point(|&b| b < us);
        if self.counts.len() <= IDLE_BOUNDS_US.len() {
            self.counts.resize(IDLE_BOUNDS_US.len() + 1, 0);
        }
        self.counts[i] += 1;
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &IdleGaps) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
    }

    /// Gaps counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0, |t, c| t.saturating_add(*c))
    }

    /// The upper bound of the bucket holding quantile `q` (0 to 1), microseconds;
    /// `None` when nothing was counted or it lies past the last bound.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen = c.saturating_add(seen);
            if seen >= rank {
                return IDLE_BOUNDS_US.get(i).copied();
            }
        }
        None
    }
}

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
    idle: Histogram,
    /// The same gaps as `idle`, in the summary's finer buckets.
    idle_gaps: Mutex<IdleGaps>,
    /// When each agent's last turn on this relay ended (until its next starts).
    free_since: Mutex<HashMap<String, Instant>>,
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
        let idle = Histogram::new(WAKE_BUCKETS);
        registry.register(
            "agent_idle_seconds",
            "From an agent's turn ending on this relay to its next turn starting there: \
             waiting for work, for the result's write and for the next claim",
            idle.clone(),
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
                idle,
                idle_gaps: Mutex::new(IdleGaps::default()),
                free_since: Mutex::new(HashMap::new()),
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

    /// `agent`'s turn ended (its driver returned): it is idle from now.
    pub fn agent_free(&self, agent: &str) {
        if let Ok(mut m) = self.inner.free_since.lock() {
            m.insert(agent.to_string(), Instant::now());
        }
    }

    /// A turn of `agent` is being started: the gap since its last turn ended on this
    /// relay (if one did) is counted.
    pub fn agent_busy(&self, agent: &str) {
        let since = match self.inner.free_since.lock() {
            Ok(mut m) => m.remove(agent),
            Err(_) => None,
        };
        if let Some(since) = since {
            let gap = since.elapsed();
            self.inner.idle.observe(gap.as_secs_f64());
            if let Ok(mut g) = self.inner.idle_gaps.lock() {
                g.observe(gap);
            }
        }
    }

    /// The agents' idle gaps counted so far.
    pub fn idle_gaps(&self) -> IdleGaps {
        self.inner
            .idle_gaps
            .lock()
            .map(|g| g.clone())
            .unwrap_or_default()
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
    fn idle_gaps_are_counted_in_their_buckets_and_merge() {
        let mut a = IdleGaps::default();
        assert_eq!(a.quantile_us(0.5), None);
        a.observe(Duration::from_micros(25)); // at a bound: that bucket
        a.observe(Duration::from_micros(26)); // just past it: the next
        a.observe(Duration::from_millis(3));
        a.observe(Duration::from_secs(11)); // past the last bound
        assert_eq!(a.total(), 4);
        assert_eq!(a.counts.len(), IDLE_BOUNDS_US.len() + 1);
        assert_eq!((a.counts[0], a.counts[1]), (1, 1));
        assert_eq!(a.quantile_us(0.25), Some(25));
        assert_eq!(a.quantile_us(0.5), Some(50));
        assert_eq!(a.quantile_us(0.75), Some(3_000));
        assert_eq!(a.quantile_us(1.0), None);
        let mut b = IdleGaps::default();
        b.observe(Duration::from_millis(3));
        b.merge(&a);
        assert_eq!(b.total(), 5);
        assert_eq!(b.quantile_us(0.6), Some(3_000));
        // A summary without gaps merges as nothing.
        b.merge(&IdleGaps::default());
        assert_eq!(b.total(), 5);
        // Counts read from a summary never overflow a merge (or its total).
        let huge = IdleGaps {
            counts: vec![u64::MAX; IDLE_BOUNDS_US.len() + 3],
        };
        b.merge(&huge);
        assert_eq!(b.total(), u64::MAX);
        assert_eq!(b.quantile_us(0.5), Some(IDLE_BOUNDS_US[0]));
    }

    #[test]
    fn an_agents_gap_runs_from_its_turn_end_to_its_next_start() {
        let m = RelayMetrics::new("r0");
        m.agent_busy("ada"); // its first turn: no gap yet
        m.agent_free("ada");
        m.agent_busy("ada");
        m.agent_busy("bo");
        let gaps = m.idle_gaps();
        assert_eq!(gaps.total(), 1);
        assert!(m
            .encode()
            .contains("huddle_relay_agent_idle_seconds_count{relay=\"r0\"} 1"));
    }

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
