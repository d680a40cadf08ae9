//! Guards: the protections a relay checks before it starts an agent turn.
//!
//! - **Loop cap.** In each scope (a room outside threads, or one thread), the fold
//!   counts consecutive agent messages since the last human or owner message. Once
//!   `loop-max` agent messages have been posted in a row, a new turn in that scope is
//!   denied until `loop-cooldown` has passed since the last agent message there, or a
//!   human or owner posts. After the cooldown one more turn may run; if the agents
//!   keep going, each further turn again waits a full cooldown: a runaway loop is
//!   slowed to one message per cooldown until a person speaks.
//! - **Rate cap.** Per room and sender, a sliding window over the database times
//!   (`at`) of the sender's `message.posted` rows: a message whose sender has posted
//!   more than `rate` messages in `(now - rate-window, now]` starts no turn. The
//!   owner is exempt (the owner steers the room).
//! - **Hops.** A forwarded message carries `"hops": n` in its body (absent = 0). A
//!   message with more than `max-hops` hops, or a `hops` that is not a whole number,
//!   starts no turn. [`next_hops`] gives the value a forward should carry.
//!
//! The fold reads only `message.posted`: role `human` or `owner` resets its scope's
//! loop count, role `agent` adds one, role `system` neither. Every row counts toward
//! its actor's rate. The limits come from the effective [`RoomConfig`] at check time,
//! so a `!config` change applies to the very next check. Time is passed in; nothing
//! here reads a clock.
//!
//! ```
//! use huddle_core::guards::{GuardFold, TurnRequest, Verdict};
//! use huddle_core::{config::RoomConfig, Role, Timestamp};
//!
//! let guards = GuardFold::new();
//! let req = TurnRequest::new("lobby", None, "ana", Role::Human, Timestamp(1_000_000));
//! assert_eq!(guards.check(&req, &RoomConfig::default()), Verdict::Allow);
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::config::{ConfigFold, ConfigKey, RoomConfig};
use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, Role, Timestamp};
use crate::verbs::Verb;

/// Most send times remembered per sender: one more than the largest `rate`, which
/// is all the rate check can ever need.
pub const RATE_MEMORY: usize = 1_001;

/// Folds `message.posted` rows into loop counts and per-sender send times.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GuardFold {
    rooms: BTreeMap<String, RoomGuards>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
struct RoomGuards {
    /// The room outside any thread.
    room: LoopRun,
    /// Each thread.
    threads: BTreeMap<String, LoopRun>,
    /// Sender -> the latest send times (`at`), ascending, at most [`RATE_MEMORY`].
    senders: BTreeMap<String, VecDeque<Timestamp>>,
}

/// Consecutive agent messages in one scope since the last human or owner message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LoopRun {
    /// How many agent messages in a row.
    pub agent_messages: u64,
    /// The latest database time among them.
    pub last_agent_at: Option<Timestamp>,
}

/// The hop count of a message, read from its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hops {
    /// A valid count (absent is 0).
    Count(u64),
    /// A `hops` field that is not a whole number (negative, fractional, text).
    Malformed,
}

/// Reads `hops` from a message body: absent is 0, a whole number is itself,
/// anything else is [`Hops::Malformed`].
pub fn hops_of(body: &Value) -> Hops {
    match body.get("hops") {
        None => Hops::Count(0),
        Some(v) => v.as_u64().map(Hops::Count).unwrap_or(Hops::Malformed),
    }
}

/// The `hops` a forward of a message with `body` should carry, or `None` when the
/// original's `hops` is malformed (do not forward it).
pub fn next_hops(body: &Value) -> Option<u64> {
    match hops_of(body) {
        Hops::Count(n) => Some(n.saturating_add(1)),
        Hops::Malformed => None,
    }
}

/// What a relay asks before starting a turn for a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnRequest<'a> {
    /// The room.
    pub room: &'a str,
    /// The thread, if the message is in one.
    pub thread: Option<&'a str>,
    /// Who posted the message that would start the turn.
    pub sender: &'a str,
    /// The sender's role.
    pub sender_role: Role,
    /// The message's hop count.
    pub hops: Hops,
    /// The current database time.
    pub now: Timestamp,
}

impl<'a> TurnRequest<'a> {
    /// A request for a message with no hops.
    pub fn new(
        room: &'a str,
        thread: Option<&'a str>,
        sender: &'a str,
        sender_role: Role,
        now: Timestamp,
    ) -> Self {
        TurnRequest {
            room,
            thread,
            sender,
            sender_role,
            hops: Hops::Count(0),
            now,
        }
    }

    /// The request for the turn a `message.posted` row would start.
    pub fn for_message(message: &'a Interaction, now: Timestamp) -> Self {
        TurnRequest {
            room: &message.room,
            thread: message.thread.as_deref(),
            sender: &message.actor,
            sender_role: message.role,
            hops: hops_of(&message.body),
            now,
        }
    }
}

/// Whether a turn may start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allow,
    /// Do not start the turn, for this reason.
    Deny(DenyReason),
}

impl Verdict {
    /// Whether the turn may start.
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow)
    }
}

/// Why a guard denied a turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// The message has been forwarded more than `max-hops` times.
    TooManyHops {
        /// Its hops.
        hops: u64,
        /// The limit.
        max_hops: u32,
    },
    /// The message's `hops` is not a whole number.
    MalformedHops,
    /// `loop-max` agent messages in a row, and the cooldown has not passed.
    LoopCap {
        /// Agent messages in a row in this scope.
        consecutive: u64,
        /// The limit.
        loop_max: u32,
        /// When the cooldown ends (database time, µs).
        until: Timestamp,
    },
    /// The sender posted more than `rate` messages in the window.
    RateCap {
        /// The sender.
        sender: String,
        /// Messages in the window.
        sent: u64,
        /// The limit.
        rate: u32,
        /// The window, ms.
        window_ms: u64,
        /// When the sender is back under the limit (database time, µs).
        retry_at: Timestamp,
    },
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::TooManyHops { hops, max_hops } => {
                write!(f, "message forwarded {hops} times; max-hops is {max_hops}")
            }
            DenyReason::MalformedHops => f.write_str("message has a malformed hops field"),
            DenyReason::LoopCap {
                consecutive,
                loop_max,
                until,
            } => write!(
                f,
                "{consecutive} agent messages in a row (loop-max {loop_max}); agents pause \
                 until {until} µs or until a person posts"
            ),
            DenyReason::RateCap {
                sender,
                sent,
                rate,
                window_ms,
                retry_at,
            } => write!(
                f,
                "{sender} posted {sent} messages in {window_ms} ms (rate {rate}); ignored \
                 until {retry_at} µs"
            ),
        }
    }
}

/// Milliseconds to microseconds, saturating.
fn ms_to_us(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX).saturating_mul(1_000)
}

impl GuardFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// The loop run of a scope.
    pub fn loop_run(&self, room: &str, thread: Option<&str>) -> LoopRun {
        let Some(r) = self.rooms.get(room) else {
            return LoopRun::default();
        };
        match thread {
            Some(t) => r.threads.get(t).copied().unwrap_or_default(),
            None => r.room,
        }
    }

    /// How many messages `sender` posted in `room` in `(now - window_ms, now]`.
    pub fn sent_in_window(&self, room: &str, sender: &str, now: Timestamp, window_ms: u64) -> u64 {
        self.window(room, sender, now, window_ms).len() as u64
    }

    /// `sender`'s send times in `(now - window_ms, now]`, ascending.
    fn window(
        &self,
        room: &str,
        sender: &str,
        now: Timestamp,
        window_ms: u64,
    ) -> std::collections::vec_deque::Iter<'_, Timestamp> {
        let Some(times) = self.rooms.get(room).and_then(|r| r.senders.get(sender)) else {
            return std::collections::vec_deque::Iter::default();
        };
        let start = now.saturating_sub(ms_to_us(window_ms));
        let lo = times.partition_point(|&t| t <= start);
        let hi = times.partition_point(|&t| t <= now);
        times.range(lo..hi.max(lo))
    }

    /// Decides whether a turn may start, under `config` (the effective config of
    /// the request's room or thread, which clamps its values). Call it after folding
    /// the message that would start the turn. Checks, in order: hops, loop cap,
    /// rate cap.
    pub fn check(&self, req: &TurnRequest<'_>, config: &RoomConfig) -> Verdict {
        // The keys a guard reads, each forced into its clamps exactly as
        // [`RoomConfig::clamped`] would, without copying the rest of the config
        // (checked for every message a relay reads).
        let mut clamped = RoomConfig::default();
        for key in [
            ConfigKey::MaxHops,
            ConfigKey::LoopMax,
            ConfigKey::LoopCooldown,
            ConfigKey::Rate,
            ConfigKey::RateWindow,
        ] {
            clamped.set(key, config.get(key));
        }
        let config = clamped;
        match req.hops {
            Hops::Malformed => return Verdict::Deny(DenyReason::MalformedHops),
            Hops::Count(hops) if hops > u64::from(config.max_hops) => {
                return Verdict::Deny(DenyReason::TooManyHops {
                    hops,
                    max_hops: config.max_hops,
                })
            }
            Hops::Count(_) => {}
        }
        let run = self.loop_run(req.room, req.thread);
        if run.agent_messages >= u64::from(config.loop_max) {
            let last = run.last_agent_at.unwrap_or(Timestamp::MIN);
            let until = last.saturating_add(ms_to_us(config.loop_cooldown_ms));
            if req.now < until {
                return Verdict::Deny(DenyReason::LoopCap {
                    consecutive: run.agent_messages,
                    loop_max: config.loop_max,
                    until,
                });
            }
        }
        if req.sender_role != Role::Owner {
            let mut window = self.window(req.room, req.sender, req.now, config.rate_window_ms);
            let rate = config.rate as usize;
            let sent = window.len();
            if sent > rate {
                // Back under the limit once the oldest (len - rate) have left.
                // (It exists: `sent > rate`.)
                let retry_at = window.nth(sent - rate - 1).map_or(req.now, |t| {
                    t.saturating_add(ms_to_us(config.rate_window_ms))
                });
                return Verdict::Deny(DenyReason::RateCap {
                    sender: req.sender.to_string(),
                    sent: sent as u64,
                    rate: config.rate,
                    window_ms: config.rate_window_ms,
                    retry_at,
                });
            }
        }
        Verdict::Allow
    }
}

impl Fold for GuardFold {
    fn apply(&mut self, i: &Interaction) {
        if i.verb != Verb::MessagePosted {
            return;
        }
        let room = slot(&mut self.rooms, &i.room);
        let run = match &i.thread {
            Some(t) => room.threads.entry(t.clone()).or_default(),
            None => &mut room.room,
        };
        match i.role {
            Role::Human | Role::Owner => *run = LoopRun::default(),
            Role::Agent => {
                run.agent_messages = run.agent_messages.saturating_add(1);
                run.last_agent_at = Some(run.last_agent_at.map_or(i.at, |t| t.max(i.at)));
            }
            Role::System => {}
        }
        let times = slot(&mut room.senders, &i.actor);
        let at = times.partition_point(|&t| t <= i.at);
        times.insert(at, i.at);
        if times.len() > RATE_MEMORY {
            times.pop_front();
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

/// The value under `key`, made when missing; the key is copied only then (this runs
/// for every message a relay reads).
fn slot<'a, V: Default>(map: &'a mut BTreeMap<String, V>, key: &str) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.to_string(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// Checks a turn for a `message.posted` row against the effective config of its
/// room or thread: the one call a relay needs.
pub fn check_message(
    guards: &GuardFold,
    config: &ConfigFold,
    message: &Interaction,
    now: Timestamp,
) -> Verdict {
    let effective = config.effective(&message.room, message.thread.as_deref());
    guards.check(&TurnRequest::for_message(message, now), &effective)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ledger_row as row;
    use proptest::prelude::*;
    use serde_json::json;

    const S: i64 = 1_000_000; // one second in µs

    /// A message at `at` µs.
    fn msg(pos: u64, at: i64, thread: Option<&str>, actor: &str, role: Role) -> Interaction {
        row(
            pos,
            at,
            "lobby",
            thread,
            Verb::MessagePosted,
            actor,
            role,
            json!({"text": "hi"}),
        )
    }

    /// A turn request at `now` µs.
    fn req<'a>(sender: &'a str, role: Role, now: i64) -> TurnRequest<'a> {
        TurnRequest::new("lobby", None, sender, role, Timestamp(now))
    }

    fn deny(v: Verdict) -> DenyReason {
        match v {
            Verdict::Deny(r) => r,
            Verdict::Allow => panic!("expected a denial"),
        }
    }

    #[test]
    fn hops_at_the_limit_pass_and_one_more_is_denied() {
        let guards = GuardFold::new();
        let config = RoomConfig::default(); // max_hops 3
        let mut r = req("ana", Role::Human, 0);
        r.hops = Hops::Count(3);
        assert_eq!(guards.check(&r, &config), Verdict::Allow);
        r.hops = Hops::Count(4);
        assert_eq!(
            deny(guards.check(&r, &config)).to_string(),
            "message forwarded 4 times; max-hops is 3"
        );
        r.hops = Hops::Malformed;
        assert_eq!(deny(guards.check(&r, &config)), DenyReason::MalformedHops);

        assert_eq!(hops_of(&json!({"text": "x"})), Hops::Count(0));
        assert_eq!(hops_of(&json!({"hops": 2})), Hops::Count(2));
        for bad in [
            json!({"hops": -1}),
            json!({"hops": 1.5}),
            json!({"hops": "2"}),
        ] {
            assert_eq!(hops_of(&bad), Hops::Malformed);
        }
        assert_eq!(next_hops(&json!({"hops": 2})), Some(3));
        assert_eq!(next_hops(&json!({})), Some(1));
        assert_eq!(next_hops(&json!({"hops": null})), None);
        let forwarded = row(
            1,
            0,
            "lobby",
            None,
            Verb::MessagePosted,
            "bot",
            Role::Agent,
            json!({"text": "fwd", "hops": 9}),
        );
        assert_eq!(
            TurnRequest::for_message(&forwarded, Timestamp(0)).hops,
            Hops::Count(9)
        );
    }

    #[test]
    fn the_loop_cap_stops_the_fifth_agent_turn_until_cooldown_or_a_person() {
        let config = RoomConfig::default(); // loop_max 4, cooldown 30 s
        let mut guards = GuardFold::new();
        guards.apply(&msg(1, 0, None, "ana", Role::Human));
        for i in 0..3 {
            guards.apply(&msg(2 + i, (i as i64 + 1) * S, None, "bot", Role::Agent));
        }
        // Three agent messages in a row: a fourth turn may still run.
        assert!(guards
            .check(&req("bot", Role::Agent, 4 * S), &config)
            .is_allow());
        guards.apply(&msg(5, 4 * S, None, "bot2", Role::Agent));
        // Four in a row: denied until 30 s after the last one.
        let r = deny(guards.check(&req("bot2", Role::Agent, 4 * S), &config));
        assert_eq!(
            r,
            DenyReason::LoopCap {
                consecutive: 4,
                loop_max: 4,
                until: Timestamp(34 * S)
            }
        );
        assert!(!guards
            .check(&req("bot", Role::Agent, 34 * S - 1), &config)
            .is_allow());
        assert!(guards
            .check(&req("bot", Role::Agent, 34 * S), &config)
            .is_allow());
        // After the cooldown one more message runs, and the next waits a full cooldown.
        guards.apply(&msg(6, 40 * S, None, "bot", Role::Agent));
        assert!(!guards
            .check(&req("bot2", Role::Agent, 41 * S), &config)
            .is_allow());
        assert!(guards
            .check(&req("bot2", Role::Agent, 70 * S), &config)
            .is_allow());
        // System rows neither count nor reset.
        guards.apply(&msg(7, 41 * S, None, "huddle", Role::System));
        assert_eq!(guards.loop_run("lobby", None).agent_messages, 5);
        // A person resets it at once; so does the owner.
        guards.apply(&msg(8, 42 * S, None, "ana", Role::Human));
        assert!(guards
            .check(&req("ana", Role::Human, 42 * S), &config)
            .is_allow());
        assert_eq!(guards.loop_run("lobby", None), LoopRun::default());
        for i in 0..4 {
            guards.apply(&msg(9 + i, 43 * S, None, "bot", Role::Agent));
        }
        assert!(!guards
            .check(&req("x", Role::Agent, 43 * S), &config)
            .is_allow());
        guards.apply(&msg(20, 44 * S, None, "olga", Role::Owner));
        assert!(guards
            .check(&req("x", Role::Agent, 44 * S), &config)
            .is_allow());
    }

    #[test]
    fn loop_counts_are_per_scope_and_config_changes_apply_at_once() {
        let mut guards = GuardFold::new();
        for i in 0..2 {
            guards.apply(&msg(1 + i, S, Some("t1"), "bot", Role::Agent));
        }
        guards.apply(&msg(10, S, None, "ana", Role::Human));
        assert_eq!(
            guards.loop_run("lobby", Some("t1")).agent_messages,
            2,
            "room message does not reset a thread"
        );
        assert_eq!(guards.loop_run("lobby", Some("t2")).agent_messages, 0);
        let t1 = TurnRequest::new("lobby", Some("t1"), "bot", Role::Agent, Timestamp(2 * S));
        assert!(guards.check(&t1, &RoomConfig::default()).is_allow());
        let strict = RoomConfig {
            loop_max: 2,
            ..RoomConfig::default()
        };
        assert!(!guards.check(&t1, &strict).is_allow());
        // A config that tries to switch the guard off is clamped on the way in.
        let off = RoomConfig {
            loop_max: 0,
            loop_cooldown_ms: 0,
            rate: 0,
            ..RoomConfig::default()
        };
        let soon = TurnRequest::new(
            "lobby",
            Some("t1"),
            "bot",
            Role::Agent,
            Timestamp(S + S / 2),
        );
        let r = deny(guards.check(&soon, &off));
        assert!(
            matches!(r, DenyReason::LoopCap { loop_max: 1, until, .. } if until == Timestamp(2 * S)),
            "{r:?}"
        );
    }

    #[test]
    fn the_rate_cap_is_a_sliding_window_over_database_time() {
        let config = RoomConfig::default(); // 10 per 60 s
        let mut guards = GuardFold::new();
        // Ten messages, one per second from t = 1 s.
        for i in 1..=10 {
            guards.apply(&msg(i as u64, i * S, None, "spam", Role::Human));
        }
        assert!(guards
            .check(&req("spam", Role::Human, 10 * S), &config)
            .is_allow());
        guards.apply(&msg(11, 11 * S, None, "spam", Role::Human));
        let r = deny(guards.check(&req("spam", Role::Human, 11 * S), &config));
        assert_eq!(
            r,
            DenyReason::RateCap {
                sender: "spam".into(),
                sent: 11,
                rate: 10,
                window_ms: 60_000,
                retry_at: Timestamp(61 * S),
            }
        );
        // The window is (now - 60 s, now]: the message at 1 s leaves at exactly 61 s.
        assert!(!guards
            .check(&req("spam", Role::Human, 61 * S - 1), &config)
            .is_allow());
        assert!(guards
            .check(&req("spam", Role::Human, 61 * S), &config)
            .is_allow());
        assert_eq!(
            guards.sent_in_window("lobby", "spam", Timestamp(61 * S), 60_000),
            10
        );
        // Others are not affected; the owner is exempt; later rows are not counted.
        assert!(guards
            .check(&req("ana", Role::Human, 11 * S), &config)
            .is_allow());
        for i in 0..20 {
            guards.apply(&msg(100 + i, 12 * S, None, "olga", Role::Owner));
        }
        assert!(guards
            .check(&req("olga", Role::Owner, 12 * S), &config)
            .is_allow());
        assert_eq!(
            guards.sent_in_window("lobby", "spam", Timestamp(5 * S), 60_000),
            5
        );
        // A tighter config applies at the next check.
        let tight = RoomConfig {
            rate: 3,
            rate_window_ms: 5_000,
            ..RoomConfig::default()
        };
        let r = deny(guards.check(&req("spam", Role::Human, 11 * S), &tight));
        assert!(
            matches!(r, DenyReason::RateCap { sent: 5, retry_at, .. } if retry_at == Timestamp(8 * S + 5 * S)),
            "{r:?}"
        );
    }

    #[test]
    fn send_times_are_bounded_and_still_exact_at_the_highest_rate() {
        let mut guards = GuardFold::new();
        for i in 0..2_500u64 {
            guards.apply(&msg(i, i as i64, None, "bot", Role::Human));
        }
        assert_eq!(guards.rooms["lobby"].senders["bot"].len(), RATE_MEMORY);
        let config = RoomConfig {
            rate: 1_000,
            rate_window_ms: 60_000,
            ..RoomConfig::default()
        };
        assert!(!guards
            .check(&req("bot", Role::Human, 2_500), &config)
            .is_allow());
        // Out-of-order times are kept sorted.
        guards.apply(&msg(3_000, -5, None, "late", Role::Human));
        guards.apply(&msg(3_001, -9, None, "late", Role::Human));
        assert_eq!(
            guards.rooms["lobby"].senders["late"],
            vec![Timestamp(-9), Timestamp(-5)]
        );
    }

    #[test]
    fn check_message_uses_the_effective_config_of_the_scope() {
        let mut config = ConfigFold::new();
        config.apply(&row(
            1,
            0,
            "lobby",
            None,
            Verb::RoomCreated,
            "olga",
            Role::Owner,
            json!({"owner": "olga"}),
        ));
        let set = row(
            2,
            0,
            "lobby",
            Some("t1"),
            Verb::ConfigSet,
            "olga",
            Role::Owner,
            json!({"set": {"max-hops": 0}}),
        );
        config.apply(&set);
        let guards = GuardFold::new();
        let fwd = |thread| {
            row(
                3,
                0,
                "lobby",
                thread,
                Verb::MessagePosted,
                "bot",
                Role::Agent,
                json!({"hops": 1}),
            )
        };
        assert!(check_message(&guards, &config, &fwd(None), Timestamp(0)).is_allow());
        assert_eq!(
            check_message(&guards, &config, &fwd(Some("t1")), Timestamp(0)),
            Verdict::Deny(DenyReason::TooManyHops {
                hops: 1,
                max_hops: 0
            })
        );
    }

    fn any_rows() -> impl Strategy<Value = Vec<Interaction>> {
        let one = (
            proptest::option::of(prop::sample::select(vec!["t1", "t2"])),
            prop::sample::select(vec!["ana", "bot", "olga"]),
            prop::sample::select(vec![Role::Owner, Role::Human, Role::Agent, Role::System]),
            -100i64..100,
            prop::sample::select(vec![Verb::MessagePosted, Verb::TurnReplied]),
        );
        prop::collection::vec(one, 0..60).prop_map(|rows| {
            let mut at = 0;
            rows.into_iter()
                .enumerate()
                .map(|(i, (thread, actor, role, step, verb))| {
                    at += step * 100_000;
                    row(
                        i as u64,
                        at,
                        "lobby",
                        thread,
                        verb,
                        actor,
                        role,
                        json!({"n": i}),
                    )
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn guard_fold_incremental_equals_rebuild_and_check_never_panics(
            rows in any_rows(),
            split in 0usize..60,
            now in any::<i64>(),
            loop_max in any::<u32>(),
            rate in any::<u32>(),
            window in any::<u64>(),
            cooldown in any::<u64>(),
            max_hops in any::<u32>(),
        ) {
            let full = GuardFold::rebuild(&rows);
            let split = split.min(rows.len());
            let mut inc = GuardFold::rebuild(&rows[..split]);
            inc.apply_all(&rows[split..]);
            prop_assert_eq!(inc.state_hash(), full.state_hash());
            let config = RoomConfig { loop_max, rate, rate_window_ms: window, loop_cooldown_ms: cooldown, max_hops, ..RoomConfig::default() };
            for thread in [None, Some("t1"), Some("t2")] {
                for (sender, role) in [("ana", Role::Human), ("bot", Role::Agent)] {
                    let r = TurnRequest::new("lobby", thread, sender, role, Timestamp(now));
                    // The guard clamps the keys it reads as the whole config's clamp would.
                    prop_assert_eq!(full.check(&r, &config), full.check(&r, &config.clamped()));
                    if let Verdict::Deny(DenyReason::RateCap { sent, rate, retry_at, .. }) = full.check(&r, &config) {
                        prop_assert!(sent > u64::from(rate));
                        prop_assert!(retry_at > Timestamp(now) || retry_at == Timestamp::MAX);
                    }
                }
            }
        }
    }
}
