//! The keys: typed values, bounds and clamps, the `config.set` body, and the
//! effective [`RoomConfig`] they make.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::binding::{check_writer_name, normalized, AgentBinding, RelayKey, MAX_BINDINGS};
use crate::limits::Limits;
use crate::model::validate_name;

/// Who answers an addressed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Responder {
    /// Every eligible agent contends at once; the first claim wins.
    Race,
    /// The `responder-agent` goes first; others wait the fallback window.
    Designated,
    /// Agents are delayed by role rank; others wait the fallback window.
    RolePriority,
}

/// How ready tasks are allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Allocation {
    /// Any eligible agent may claim a ready task (under every allocation a task's
    /// `@agent` assignee goes first, for one claim lease).
    Pull,
    /// The task's assignee claims it (anyone when it has none).
    Push,
    /// Agents bid; at the end of the bid window the best bid claims.
    Bid,
}

/// A team shape: one choice that sets the responder and allocation pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// Peers: `race` + `pull` (whoever is free answers and takes work).
    Peer,
    /// Orchestrator and workers: `designated` + `push` (the `responder-agent` answers
    /// and delegates; tasks go to their assignees).
    Orchestrator,
    /// Pipeline: `role-priority` + `pull` (agents answer by rank; the DAG unlocks
    /// steps in order and any capable agent takes the next).
    Pipeline,
    /// Market (contract net): `race` + `bid` (agents bid for tasks; the best bid wins
    /// at the end of the bid window).
    Market,
}

impl Topology {
    /// Every topology, in documentation order.
    pub const ALL: [Topology; 4] = [
        Topology::Peer,
        Topology::Orchestrator,
        Topology::Pipeline,
        Topology::Market,
    ];

    /// The value as typed in `!config` and stored in `config.set`.
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Peer => "peer",
            Topology::Orchestrator => "orchestrator",
            Topology::Pipeline => "pipeline",
            Topology::Market => "market",
        }
    }

    /// The responder policy it sets.
    pub fn responder(self) -> Responder {
        match self {
            Topology::Peer | Topology::Market => Responder::Race,
            Topology::Orchestrator => Responder::Designated,
            Topology::Pipeline => Responder::RolePriority,
        }
    }

    /// The allocation policy it sets.
    pub fn allocation(self) -> Allocation {
        match self {
            Topology::Peer | Topology::Pipeline => Allocation::Pull,
            Topology::Orchestrator => Allocation::Push,
            Topology::Market => Allocation::Bid,
        }
    }

    /// The value `topology` gives `key` (`responder`, `allocation`), if it sets it.
    pub fn preset(self, key: ConfigKey) -> Option<ConfigValue> {
        match key {
            ConfigKey::Responder => Some(ConfigValue::Responder(self.responder())),
            ConfigKey::Allocation => Some(ConfigValue::Allocation(self.allocation())),
            _ => None,
        }
    }
}

/// How a group mention (`@@cap`) is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupReply {
    /// Every member of the group answers once.
    Each,
    /// One member answers for the group, chosen by the responder policy.
    One,
}

impl GroupReply {
    /// Every value, in documentation order.
    pub const ALL: [GroupReply; 2] = [GroupReply::Each, GroupReply::One];

    /// The value as typed in `!config` and stored in `config.set`.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupReply::Each => "each",
            GroupReply::One => "one",
        }
    }
}

/// The effective configuration of a room or thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomConfig {
    /// Responder policy.
    pub responder: Responder,
    /// The designated agent (for `designated`), or the ordered preference list head.
    pub responder_agent: Option<String>,
    /// How long non-preferred agents wait before contending, ms (default 1,500).
    pub responder_window_ms: u64,
    /// Allocation policy.
    pub allocation: Allocation,
    /// Claim lease, ms (default 60,000).
    pub claim_ttl_ms: u64,
    /// Bid window, ms (default 2,000).
    pub bid_window_ms: u64,
    /// Attempts per task before it fails for good (default 3).
    pub max_attempts: u32,
    /// Consecutive agent turns without a human message (default 4).
    pub loop_max: u32,
    /// Cooldown after the turn cap is hit, ms (default 30,000).
    pub loop_cooldown_ms: u64,
    /// Messages per sender per window (default 10).
    pub rate: u32,
    /// Rate window, ms (default 60,000).
    pub rate_window_ms: u64,
    /// Whether agents answer only when mentioned.
    pub require_mention: bool,
    /// Room token budget; `None` is unlimited.
    pub budget: Option<u64>,
    /// Most forwards a message may have travelled (default 3).
    pub max_hops: u32,
    /// Agents allowed to create tasks (`task_delegate`), sorted; none by default.
    #[serde(default)]
    pub delegators: Vec<String>,
    /// Agents bound to the writers that may write as them, sorted; none by default
    /// (see [`super::binding`]).
    #[serde(default)]
    pub agents: Vec<AgentBinding>,
    /// How a message addressed only to `@@cap` groups is answered (default each).
    #[serde(default = "default_group_reply")]
    pub group_reply: GroupReply,
    /// The team shape last chosen; its responder and allocation apply where those
    /// keys are not set themselves (the config fold does that layering).
    #[serde(default = "default_topology")]
    pub topology: Topology,
    /// Bytes of the `<thread>` block in prompts (0 leaves it out; default 4,096).
    #[serde(default = "default_thread_context")]
    pub thread_context_bytes: u32,
    /// How old a message may be and still be answered, ms (default 5 minutes); an
    /// older unanswered one gets a notice to its author.
    #[serde(default = "default_reply_horizon")]
    pub reply_horizon_ms: u64,
    /// Failed reply turns after which a message is given up, with a notice to its
    /// author (default 3).
    #[serde(default = "default_max_reply_failures")]
    pub max_reply_failures: u32,
    /// Writers' registered signing keys, sorted; none by default (see
    /// [`super::binding::writer_proof`]).
    #[serde(default)]
    pub relay_keys: Vec<RelayKey>,
    /// Whether rows must be signed by a registered writer key to count.
    #[serde(default)]
    pub require_signatures: bool,
    /// The back-off before a failed task's second attempt, ms (default 1,000; 0: none);
    /// it doubles with every further attempt, up to `retry_backoff_max_ms`, jittered
    /// (see [`crate::pacing`]).
    #[serde(default = "default_retry_backoff")]
    pub retry_backoff_ms: u64,
    /// The longest back-off between attempts, ms (default 60,000).
    #[serde(default = "default_retry_backoff_max")]
    pub retry_backoff_max_ms: u64,
    /// Failed turns in a row after which an agent is benched (default 5; 0: never).
    #[serde(default = "default_breaker")]
    pub breaker: u32,
    /// How long a benched agent gets no work, ms (default 60,000).
    #[serde(default = "default_breaker_cooldown")]
    pub breaker_cooldown_ms: u64,
    /// A turn with no activity for this long is cancelled and failed, ms (default 0:
    /// never).
    #[serde(default)]
    pub stall_timeout_ms: u64,
    /// Rejections a reviewed task (`[review @agent]`) may have before it fails for
    /// good, when its line does not say (default 3).
    #[serde(default = "default_review_rounds")]
    pub review_rounds: u32,
    /// Whether a busy agent may hold its next task while it works (plan 0084;
    /// default off).
    #[serde(default)]
    pub lease_ahead: bool,
    /// How many tasks an agent may hold ahead under `lease_ahead` (plan 0085; default
    /// 4).
    #[serde(default = "default_lease_depth")]
    pub lease_depth: u32,
    /// Whether a task turn is written in two rows, its start and end carried by the
    /// task's own `task.claimed` and `task.completed` / `task.failed` (plan 0095;
    /// default off: four rows, which relays built before the two-row readers read
    /// too).
    #[serde(default)]
    pub compact_turns: bool,
}

fn default_lease_depth() -> u32 {
    4
}

fn default_review_rounds() -> u32 {
    crate::protocol::task::DEFAULT_REVIEW_ROUNDS
}

fn default_retry_backoff() -> u64 {
    1_000
}

fn default_retry_backoff_max() -> u64 {
    60_000
}

fn default_breaker() -> u32 {
    5
}

fn default_breaker_cooldown() -> u64 {
    60_000
}

fn default_reply_horizon() -> u64 {
    300_000
}

fn default_max_reply_failures() -> u32 {
    3
}

fn default_thread_context() -> u32 {
    4_096
}

fn default_topology() -> Topology {
    Topology::Peer
}

fn default_group_reply() -> GroupReply {
    GroupReply::Each
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            responder: Responder::Race,
            responder_agent: None,
            responder_window_ms: 1_500,
            allocation: Allocation::Pull,
            claim_ttl_ms: 60_000,
            bid_window_ms: 2_000,
            max_attempts: 3,
            loop_max: 4,
            loop_cooldown_ms: 30_000,
            rate: 10,
            rate_window_ms: 60_000,
            require_mention: false,
            budget: None,
            max_hops: 3,
            delegators: Vec::new(),
            agents: Vec::new(),
            group_reply: GroupReply::Each,
            topology: Topology::Peer,
            thread_context_bytes: 4_096,
            reply_horizon_ms: 300_000,
            max_reply_failures: 3,
            relay_keys: Vec::new(),
            require_signatures: false,
            retry_backoff_ms: default_retry_backoff(),
            retry_backoff_max_ms: default_retry_backoff_max(),
            breaker: default_breaker(),
            breaker_cooldown_ms: default_breaker_cooldown(),
            stall_timeout_ms: 0,
            review_rounds: default_review_rounds(),
            lease_ahead: false,
            compact_turns: false,
            lease_depth: default_lease_depth(),
        }
    }
}

impl Responder {
    /// Every responder policy, in documentation order.
    pub const ALL: [Responder; 3] = [
        Responder::Race,
        Responder::Designated,
        Responder::RolePriority,
    ];

    /// The value as typed in `!config` and stored in `config.set`.
    pub fn as_str(self) -> &'static str {
        match self {
            Responder::Race => "race",
            Responder::Designated => "designated",
            Responder::RolePriority => "role-priority",
        }
    }
}

impl Allocation {
    /// Every allocation policy, in documentation order.
    pub const ALL: [Allocation; 3] = [Allocation::Pull, Allocation::Push, Allocation::Bid];

    /// The value as typed in `!config` and stored in `config.set`.
    pub fn as_str(self) -> &'static str {
        match self {
            Allocation::Pull => "pull",
            Allocation::Push => "push",
            Allocation::Bid => "bid",
        }
    }
}

/// A key of the room configuration, as typed in `!config` (kebab-case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigKey {
    /// `topology`: the team shape, setting `responder` and `allocation` together.
    Topology,
    /// `responder`: who answers an addressed message.
    Responder,
    /// `responder-agent`: the preferred agent under `designated`.
    ResponderAgent,
    /// `responder-window`: how long non-preferred agents wait.
    ResponderWindow,
    /// `allocation`: how ready tasks are allocated.
    Allocation,
    /// `claim-ttl`: the lease of every claim.
    ClaimTtl,
    /// `bid-window`: how long bids are collected under `bid`.
    BidWindow,
    /// `max-attempts`: attempts per task before it fails for good.
    MaxAttempts,
    /// `loop-max`: consecutive agent messages before the loop guard steps in.
    LoopMax,
    /// `loop-cooldown`: the quiet time the loop guard then asks for.
    LoopCooldown,
    /// `rate`: messages per sender per `rate-window`.
    Rate,
    /// `rate-window`: the sliding window of the rate cap.
    RateWindow,
    /// `require-mention`: whether agents answer only when mentioned.
    RequireMention,
    /// `budget`: the room's token budget.
    Budget,
    /// `max-hops`: how many forwards a message may have travelled.
    MaxHops,
    /// `delegators`: agents allowed to create tasks with `task_delegate`.
    Delegators,
    /// `agents`: agents bound to the writers that may write as them.
    Agents,
    /// `group-reply`: whether each member of an `@@cap` group answers, or one.
    GroupReply,
    /// `thread-context`: bytes of the `<thread>` block in prompts.
    ThreadContext,
    /// `reply-horizon`: how old a message may be and still be answered.
    ReplyHorizon,
    /// `max-reply-failures`: failed reply turns before a message is given up.
    MaxReplyFailures,
    /// `relay-keys`: writers' signing keys; a registered writer's rows count only
    /// when signed by one of its keys.
    RelayKeys,
    /// `require-signatures`: rows count only when signed by a registered writer key
    /// (or by the owner, or derived from a verified command).
    RequireSignatures,
    /// `retry-backoff`: the back-off before a failed task's next attempt.
    RetryBackoff,
    /// `retry-backoff-max`: the longest back-off between attempts.
    RetryBackoffMax,
    /// `breaker`: failed turns in a row after which an agent is benched.
    Breaker,
    /// `breaker-cooldown`: how long a benched agent gets no work.
    BreakerCooldown,
    /// `stall-timeout`: a turn with no activity for this long is cancelled.
    StallTimeout,
    /// `review-rounds`: rejections a reviewed task may have before it fails for good.
    ReviewRounds,
    /// `lease-ahead`: whether a busy agent may hold its next task while it works.
    LeaseAhead,
    /// `lease-depth`: how many tasks an agent may hold ahead under `lease-ahead`.
    LeaseDepth,
    /// `compact-turns`: whether a task turn is written in two rows (plan 0095).
    CompactTurns,
}

/// The kind of value a [`ConfigKey`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// `race`, `designated` or `role-priority`.
    Responder,
    /// `pull`, `push` or `bid`.
    Allocation,
    /// An agent name.
    Agent,
    /// A duration such as `500ms`, `30s`, `2m`, `1h`, `1m30s`, `1.5s`.
    Duration,
    /// A whole number.
    Count,
    /// `on` / `off` (also `true` / `false`, `yes` / `no`).
    Flag,
    /// A token count (`50000`, `200k`, `1.5M`) or `unlimited`.
    Budget,
    /// Agent names separated by commas (`lead,planner`), or `none`.
    Agents,
    /// `agent@writer` entries separated by commas (`ada@relay-a,bo@relay-b`), or
    /// `none`.
    Bindings,
    /// `each` or `one`.
    GroupReply,
    /// `peer`, `orchestrator`, `pipeline` or `market`.
    Topology,
    /// `writer=<64 hex>` entries separated by commas, or `none`.
    WriterKeys,
}

/// The inclusive range a numeric key is clamped into. Durations are in
/// milliseconds, counts in their unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Smallest allowed value.
    pub min: u64,
    /// Largest allowed value.
    pub max: u64,
}

impl Bounds {
    /// Clamps `v` into the range.
    pub fn clamp(self, v: u64) -> u64 {
        v.clamp(self.min, self.max)
    }

    /// Whether `v` lies inside the range.
    pub fn contains(self, v: u64) -> bool {
        (self.min..=self.max).contains(&v)
    }
}

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// The largest room budget, in tokens (one trillion).
pub const MAX_BUDGET: u64 = 1_000_000_000_000;

impl ConfigKey {
    /// Every key, in documentation order.
    pub const ALL: [ConfigKey; 32] = [
        ConfigKey::Topology,
        ConfigKey::Responder,
        ConfigKey::ResponderAgent,
        ConfigKey::ResponderWindow,
        ConfigKey::Allocation,
        ConfigKey::ClaimTtl,
        ConfigKey::BidWindow,
        ConfigKey::MaxAttempts,
        ConfigKey::LoopMax,
        ConfigKey::LoopCooldown,
        ConfigKey::Rate,
        ConfigKey::RateWindow,
        ConfigKey::RequireMention,
        ConfigKey::Budget,
        ConfigKey::MaxHops,
        ConfigKey::Delegators,
        ConfigKey::Agents,
        ConfigKey::GroupReply,
        ConfigKey::ThreadContext,
        ConfigKey::ReplyHorizon,
        ConfigKey::MaxReplyFailures,
        ConfigKey::RelayKeys,
        ConfigKey::RequireSignatures,
        ConfigKey::RetryBackoff,
        ConfigKey::RetryBackoffMax,
        ConfigKey::Breaker,
        ConfigKey::BreakerCooldown,
        ConfigKey::StallTimeout,
        ConfigKey::ReviewRounds,
        ConfigKey::LeaseAhead,
        ConfigKey::LeaseDepth,
        ConfigKey::CompactTurns,
    ];

    /// The key as typed in `!config` and stored in `config.set`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKey::Responder => "responder",
            ConfigKey::ResponderAgent => "responder-agent",
            ConfigKey::ResponderWindow => "responder-window",
            ConfigKey::Allocation => "allocation",
            ConfigKey::ClaimTtl => "claim-ttl",
            ConfigKey::BidWindow => "bid-window",
            ConfigKey::MaxAttempts => "max-attempts",
            ConfigKey::LoopMax => "loop-max",
            ConfigKey::LoopCooldown => "loop-cooldown",
            ConfigKey::Rate => "rate",
            ConfigKey::RateWindow => "rate-window",
            ConfigKey::RequireMention => "require-mention",
            ConfigKey::Budget => "budget",
            ConfigKey::MaxHops => "max-hops",
            ConfigKey::Delegators => "delegators",
            ConfigKey::Agents => "agents",
            ConfigKey::GroupReply => "group-reply",
            ConfigKey::Topology => "topology",
            ConfigKey::ThreadContext => "thread-context",
            ConfigKey::ReplyHorizon => "reply-horizon",
            ConfigKey::MaxReplyFailures => "max-reply-failures",
            ConfigKey::RelayKeys => "relay-keys",
            ConfigKey::RequireSignatures => "require-signatures",
            ConfigKey::RetryBackoff => "retry-backoff",
            ConfigKey::RetryBackoffMax => "retry-backoff-max",
            ConfigKey::Breaker => "breaker",
            ConfigKey::BreakerCooldown => "breaker-cooldown",
            ConfigKey::StallTimeout => "stall-timeout",
            ConfigKey::ReviewRounds => "review-rounds",
            ConfigKey::LeaseAhead => "lease-ahead",
            ConfigKey::LeaseDepth => "lease-depth",
            ConfigKey::CompactTurns => "compact-turns",
        }
    }

    /// Whether the key applies to the whole room only: who may write as whom and
    /// which rows count are not a question of one conversation, and relays, agent
    /// sessions and the database check them per room. Such a key is refused in a
    /// thread (unless `!config room ...`) and read from the room overlay only.
    pub fn room_wide(self) -> bool {
        matches!(
            self,
            ConfigKey::Agents
                | ConfigKey::RelayKeys
                | ConfigKey::RequireSignatures
                | ConfigKey::CompactTurns
        )
    }

    /// The key named exactly `name`, if any.
    pub fn from_name(name: &str) -> Option<ConfigKey> {
        ConfigKey::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The kind of value the key takes.
    pub fn kind(self) -> ValueKind {
        match self {
            ConfigKey::Responder => ValueKind::Responder,
            ConfigKey::ResponderAgent => ValueKind::Agent,
            ConfigKey::Allocation => ValueKind::Allocation,
            ConfigKey::ResponderWindow
            | ConfigKey::ClaimTtl
            | ConfigKey::BidWindow
            | ConfigKey::LoopCooldown
            | ConfigKey::RateWindow
            | ConfigKey::ReplyHorizon
            | ConfigKey::RetryBackoff
            | ConfigKey::RetryBackoffMax
            | ConfigKey::BreakerCooldown
            | ConfigKey::StallTimeout => ValueKind::Duration,
            ConfigKey::MaxAttempts
            | ConfigKey::LoopMax
            | ConfigKey::Rate
            | ConfigKey::MaxHops
            | ConfigKey::ThreadContext
            | ConfigKey::MaxReplyFailures
            | ConfigKey::Breaker
            | ConfigKey::ReviewRounds
            | ConfigKey::LeaseDepth => ValueKind::Count,
            ConfigKey::RequireMention
            | ConfigKey::RequireSignatures
            | ConfigKey::LeaseAhead
            | ConfigKey::CompactTurns => ValueKind::Flag,
            ConfigKey::Budget => ValueKind::Budget,
            ConfigKey::Delegators => ValueKind::Agents,
            ConfigKey::Agents => ValueKind::Bindings,
            ConfigKey::GroupReply => ValueKind::GroupReply,
            ConfigKey::Topology => ValueKind::Topology,
            ConfigKey::RelayKeys => ValueKind::WriterKeys,
        }
    }

    /// The clamp range of a numeric key (durations in ms); `None` for the others.
    pub fn bounds(self) -> Option<Bounds> {
        let b = |min, max| Some(Bounds { min, max });
        match self {
            ConfigKey::ResponderWindow => b(0, MINUTE),
            ConfigKey::ClaimTtl => b(SECOND, HOUR),
            ConfigKey::BidWindow => b(100, 10 * MINUTE),
            ConfigKey::MaxAttempts => b(1, 100),
            ConfigKey::LoopMax => b(1, 100),
            ConfigKey::LoopCooldown => b(SECOND, 24 * HOUR),
            ConfigKey::Rate => b(1, 1_000),
            ConfigKey::RateWindow => b(SECOND, 24 * HOUR),
            ConfigKey::Budget => b(0, MAX_BUDGET),
            ConfigKey::MaxHops => b(0, 16),
            ConfigKey::ThreadContext => b(0, 65_536),
            ConfigKey::ReplyHorizon => b(10 * SECOND, 24 * HOUR),
            ConfigKey::MaxReplyFailures => b(1, 20),
            ConfigKey::RetryBackoff => b(0, HOUR),
            ConfigKey::RetryBackoffMax => b(SECOND, 24 * HOUR),
            ConfigKey::Breaker => b(0, 100),
            ConfigKey::BreakerCooldown => b(SECOND, 24 * HOUR),
            ConfigKey::StallTimeout => b(0, 24 * HOUR),
            ConfigKey::ReviewRounds => b(1, u64::from(crate::protocol::task::MAX_REVIEW_ROUNDS)),
            ConfigKey::LeaseDepth => b(1, 16),
            ConfigKey::Responder
            | ConfigKey::ResponderAgent
            | ConfigKey::Allocation
            | ConfigKey::RequireMention
            | ConfigKey::Delegators
            | ConfigKey::Agents
            | ConfigKey::GroupReply
            | ConfigKey::Topology
            | ConfigKey::RelayKeys
            | ConfigKey::RequireSignatures
            | ConfigKey::LeaseAhead
            | ConfigKey::CompactTurns => None,
        }
    }

    /// One line on what the key means, for `!config help`.
    pub fn meaning(self) -> &'static str {
        match self {
            ConfigKey::Responder => {
                "who answers an addressed message: race (first claim wins), designated \
                 (responder-agent first), role-priority (by role rank)"
            }
            ConfigKey::ResponderAgent => "the preferred agent under responder designated",
            ConfigKey::ResponderWindow => {
                "how long non-preferred agents wait before contending; a silent preferred \
                 agent degrades to a race after it"
            }
            ConfigKey::Allocation => {
                "how ready tasks are allocated: pull (any eligible agent), push (the \
                 assignee), bid (best bid at the end of the bid window); under all three \
                 a task's @agent goes first for one claim lease"
            }
            ConfigKey::ClaimTtl => {
                "lease of every claim; failover after a crash takes about this long"
            }
            ConfigKey::BidWindow => "how long bids are collected under allocation bid",
            ConfigKey::MaxAttempts => "attempts per task before it fails for good",
            ConfigKey::LoopMax => {
                "consecutive agent messages (no human or owner message between) before \
                 agents must pause"
            }
            ConfigKey::LoopCooldown => {
                "the quiet time agents wait once loop-max is reached (a human or owner \
                 message ends it at once)"
            }
            ConfigKey::Rate => "messages a sender may post per rate-window before agents ignore it",
            ConfigKey::RateWindow => "the sliding window of the rate cap",
            ConfigKey::RequireMention => "whether agents answer only messages that mention them",
            ConfigKey::Budget => "room token budget; when spent, no new task claims",
            ConfigKey::MaxHops => "how many times a message may have been forwarded",
            ConfigKey::Delegators => {
                "agents allowed to create tasks with task_delegate (the !delegate grammar \
                 and limits)"
            }
            ConfigKey::Agents => {
                "agents bound to the writers (relay ids; database roles on Postgres) that \
                 may write as them; rows written as a bound agent by another writer are \
                 ignored (room-wide)"
            }
            ConfigKey::RelayKeys => {
                "writers' signing keys (huddle writer-key ID shows one); a listed \
                 writer's rows count only when signed by one of its keys (room-wide)"
            }
            ConfigKey::RequireSignatures => {
                "whether rows count only when signed by a key in relay-keys (owner-signed \
                 commands and the rows they derive always count; room-wide)"
            }
            ConfigKey::LeaseAhead => {
                "whether an agent busy with a task may claim its next one while it works, so \
                 the next turn starts without waiting for the database (trades fairness for \
                 throughput: a task held ahead waits for that agent)"
            }
            ConfigKey::LeaseDepth => {
                "how many tasks an agent busy with a task may hold ahead under lease-ahead \
                 on; deeper keeps short turns fed, at more tasks waiting for one agent"
            }
            ConfigKey::CompactTurns => {
                "whether a task turn is recorded in two rows, its start and end carried by \
                 the task's own rows, instead of four (less for the database and every \
                 relay to check and fold; every relay serving the room must read the \
                 two-row form; room-wide)"
            }
            ConfigKey::ReplyHorizon => {
                "how old a message may be and still be answered; an older unanswered one \
                 gets a notice to its author saying why"
            }
            ConfigKey::MaxReplyFailures => {
                "failed reply turns after which a message is given up, with a notice to its \
                 author"
            }
            ConfigKey::ThreadContext => {
                "bytes of the <thread> block in every prompt: the messages of the thread \
                 since the agent last spoke there, newest last (0 leaves it out)"
            }
            ConfigKey::Topology => {
                "the team shape, setting responder and allocation together: peer (race + \
                 pull), orchestrator (designated + push), pipeline (role-priority + pull), \
                 market (race + bid); responder or allocation set themselves still win"
            }
            ConfigKey::GroupReply => {
                "how a message addressed only to @@cap groups is answered: each (every \
                 member once) or one (one member, chosen by the responder policy)"
            }
            ConfigKey::RetryBackoff => {
                "how long a failed task waits before its next attempt; doubles with every \
                 attempt up to retry-backoff-max, jittered (0: retry at once)"
            }
            ConfigKey::RetryBackoffMax => "the longest back-off between attempts of a task",
            ConfigKey::Breaker => {
                "failed turns in a row after which an agent is benched for breaker-cooldown \
                 (0: never)"
            }
            ConfigKey::BreakerCooldown => {
                "how long a benched agent is offered no work; then one trial turn decides"
            }
            ConfigKey::StallTimeout => {
                "a turn with no activity (exec: no output; ACP: no update) for this long is \
                 cancelled and failed, so its work is retried (0: never)"
            }
            ConfigKey::ReviewRounds => {
                "rejections a task with [review @agent] may have before it fails for good \
                 (its line's [review @agent rounds N] wins; read when the task is created)"
            }
        }
    }

    /// The default value (what a room that sets nothing gets).
    pub fn default_value(self) -> ConfigValue {
        RoomConfig::default().get(self)
    }

    /// A human description of the accepted values, for help and errors.
    pub fn expected(self) -> String {
        match (self.kind(), self.bounds()) {
            (ValueKind::Responder, _) => "race, designated or role-priority".to_string(),
            (ValueKind::Allocation, _) => "pull, push or bid".to_string(),
            (ValueKind::GroupReply, _) => "each or one".to_string(),
            (ValueKind::Topology, _) => "peer, orchestrator, pipeline or market".to_string(),
            (ValueKind::Agent, _) => "an agent name (no spaces or '/'), or none".to_string(),
            (ValueKind::Flag, _) => "on or off".to_string(),
            (ValueKind::Agents, _) => format!(
                "agent names separated by commas, no spaces (lead,planner; at most \
                 {MAX_DELEGATORS}), or none"
            ),
            (ValueKind::Bindings, _) => format!(
                "agent@writer entries separated by commas, no spaces (ada@relay-a,\
                 ada@relay-b; at most {MAX_BINDINGS}), or none"
            ),
            (ValueKind::WriterKeys, _) => format!(
                "writer=key entries separated by commas, no spaces, each key 64 hex digits \
                 (relay-a=3f2a...,relay-b=9c01...; at most {MAX_BINDINGS}), or none"
            ),
            (ValueKind::Duration, Some(b)) => format!(
                "a duration such as 500ms, 30s, 2m or 1h, from {} to {}",
                format_duration(b.min),
                format_duration(b.max)
            ),
            (ValueKind::Count, Some(b)) => format!("a whole number from {} to {}", b.min, b.max),
            (ValueKind::Budget, Some(b)) => format!(
                "a token count such as 50000 or 200k (at most {}), or unlimited",
                format_count(b.max)
            ),
            (ValueKind::Duration | ValueKind::Count | ValueKind::Budget, None) => {
                "a number".to_string()
            }
        }
    }

    /// Parses a value typed in `!config`, clamping numbers into [`Self::bounds`].
    /// A clamp is reported as a [`ClampNote`], never applied silently.
    pub fn parse_value(self, text: &str) -> Result<(ConfigValue, Option<ClampNote>), ValueError> {
        let bad = || ValueError {
            key: self,
            value: shorten(text),
            expected: self.expected(),
        };
        let lower = text.to_ascii_lowercase();
        let number = |n: Signed| -> (ConfigValue, Option<ClampNote>) {
            let bounds = self.bounds().unwrap_or(Bounds {
                min: 0,
                max: u64::MAX,
            });
            let (used, limit) = n.clamp_into(bounds);
            let value = match self.kind() {
                ValueKind::Duration => ConfigValue::Millis(used),
                ValueKind::Budget => ConfigValue::Budget(Some(used)),
                _ => ConfigValue::Count(used),
            };
            let note = limit.map(|limit| ClampNote {
                key: self,
                given: shorten(text),
                used: value.clone(),
                limit,
            });
            (value, note)
        };
        match self.kind() {
            ValueKind::Responder => Responder::ALL
                .into_iter()
                .find(|r| r.as_str() == lower)
                .map(|r| (ConfigValue::Responder(r), None))
                .ok_or_else(bad),
            ValueKind::Allocation => Allocation::ALL
                .into_iter()
                .find(|a| a.as_str() == lower)
                .map(|a| (ConfigValue::Allocation(a), None))
                .ok_or_else(bad),
            ValueKind::Topology => Topology::ALL
                .into_iter()
                .find(|t| t.as_str() == lower)
                .map(|t| (ConfigValue::Topology(t), None))
                .ok_or_else(bad),
            ValueKind::GroupReply => GroupReply::ALL
                .into_iter()
                .find(|g| g.as_str() == lower)
                .map(|g| (ConfigValue::GroupReply(g), None))
                .ok_or_else(bad),
            ValueKind::Agent => {
                if lower == "none" {
                    return Ok((ConfigValue::Agent(None), None));
                }
                let name = text.strip_prefix('@').unwrap_or(text);
                check_agent_name(name).map_err(|_| bad())?;
                Ok((ConfigValue::Agent(Some(name.to_string())), None))
            }
            ValueKind::Agents => {
                if lower == "none" {
                    return Ok((ConfigValue::Agents(Vec::new()), None));
                }
                let names: Vec<String> = text
                    .split(',')
                    .map(|n| n.strip_prefix('@').unwrap_or(n).to_string())
                    .collect();
                agent_list(names).map(|v| (v, None)).ok_or_else(bad)
            }
            ValueKind::Bindings => {
                if lower == "none" {
                    return Ok((ConfigValue::Bindings(Vec::new()), None));
                }
                let list: Result<Vec<AgentBinding>, String> =
                    text.split(',').map(AgentBinding::parse).collect();
                let list = list.ok().and_then(normalized).ok_or_else(bad)?;
                Ok((ConfigValue::Bindings(list), None))
            }
            ValueKind::WriterKeys => {
                if lower == "none" {
                    return Ok((ConfigValue::WriterKeys(Vec::new()), None));
                }
                let list: Result<Vec<RelayKey>, String> =
                    text.split(',').map(RelayKey::parse).collect();
                let list = list.ok().and_then(normalized).ok_or_else(bad)?;
                Ok((ConfigValue::WriterKeys(list), None))
            }
            ValueKind::Flag => match lower.as_str() {
                "on" | "true" | "yes" | "1" => Ok((ConfigValue::Flag(true), None)),
                "off" | "false" | "no" | "0" => Ok((ConfigValue::Flag(false), None)),
                _ => Err(bad()),
            },
            ValueKind::Duration => parse_duration_signed(text).map(number).map_err(|_| bad()),
            ValueKind::Count => parse_number(text, false).map(number).map_err(|_| bad()),
            ValueKind::Budget => {
                if matches!(lower.as_str(), "unlimited" | "none") {
                    return Ok((ConfigValue::Budget(None), None));
                }
                parse_number(text, true).map(number).map_err(|_| bad())
            }
        }
    }

    /// Reads a value from a `config.set` body (see [`ConfigSetBody`]). The value is
    /// type-checked, not clamped (clamping happens when the config is read).
    pub fn value_from_json(self, v: &Value) -> Result<ConfigValue, String> {
        let expect = |what: &str| format!("{}: expected {what}, got {v}", self.as_str());
        let whole = |v: &Value| -> Option<u64> {
            // Negative whole numbers clamp to the minimum when read.
            v.as_u64().or_else(|| v.as_i64().map(|_| 0))
        };
        match self.kind() {
            ValueKind::Responder => v
                .as_str()
                .and_then(|s| Responder::ALL.into_iter().find(|r| r.as_str() == s))
                .map(ConfigValue::Responder)
                .ok_or_else(|| expect("race, designated or role-priority")),
            ValueKind::Allocation => v
                .as_str()
                .and_then(|s| Allocation::ALL.into_iter().find(|a| a.as_str() == s))
                .map(ConfigValue::Allocation)
                .ok_or_else(|| expect("pull, push or bid")),
            ValueKind::Topology => v
                .as_str()
                .and_then(|s| Topology::ALL.into_iter().find(|t| t.as_str() == s))
                .map(ConfigValue::Topology)
                .ok_or_else(|| expect("peer, orchestrator, pipeline or market")),
            ValueKind::GroupReply => v
                .as_str()
                .and_then(|s| GroupReply::ALL.into_iter().find(|g| g.as_str() == s))
                .map(ConfigValue::GroupReply)
                .ok_or_else(|| expect("each or one")),
            ValueKind::Agent if v.is_null() => Ok(ConfigValue::Agent(None)),
            ValueKind::Agent => v
                .as_str()
                .filter(|s| check_agent_name(s).is_ok())
                .map(|s| ConfigValue::Agent(Some(s.to_string())))
                .ok_or_else(|| expect("an agent name or null")),
            ValueKind::Agents => v
                .as_array()
                .and_then(|names| {
                    let names: Option<Vec<String>> = names
                        .iter()
                        .map(|n| n.as_str().map(str::to_string))
                        .collect();
                    agent_list(names?)
                })
                .ok_or_else(|| expect("a list of agent names")),
            ValueKind::Bindings => v
                .as_array()
                .and_then(|entries| {
                    let list: Option<Vec<AgentBinding>> = entries
                        .iter()
                        .map(|e| e.as_str().and_then(|e| AgentBinding::parse(e).ok()))
                        .collect();
                    normalized(list?)
                })
                .map(ConfigValue::Bindings)
                .ok_or_else(|| expect("a list of agent@writer entries")),
            ValueKind::WriterKeys => v
                .as_array()
                .and_then(|entries| {
                    let list: Option<Vec<RelayKey>> = entries
                        .iter()
                        .map(|e| e.as_str().and_then(|e| RelayKey::parse(e).ok()))
                        .collect();
                    normalized(list?)
                })
                .map(ConfigValue::WriterKeys)
                .ok_or_else(|| expect("a list of writer=key entries")),
            ValueKind::Flag => v
                .as_bool()
                .map(ConfigValue::Flag)
                .ok_or_else(|| expect("true or false")),
            ValueKind::Duration => whole(v)
                .map(ConfigValue::Millis)
                .ok_or_else(|| expect("whole milliseconds")),
            ValueKind::Count => whole(v)
                .map(ConfigValue::Count)
                .ok_or_else(|| expect("a whole number")),
            ValueKind::Budget => {
                if v.is_null() {
                    Ok(ConfigValue::Budget(None))
                } else {
                    whole(v)
                        .map(|n| ConfigValue::Budget(Some(n)))
                        .ok_or_else(|| expect("whole tokens or null"))
                }
            }
        }
    }

    /// Clamps a value of this key into its bounds, silently (the read-side clamp).
    /// A value of the wrong kind becomes the default.
    pub fn clamp(self, value: ConfigValue) -> ConfigValue {
        let mut config = RoomConfig::default();
        config.set(self, value);
        config.get(self)
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConfigKey {
    type Err = UnknownKey;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ConfigKey::from_name(s).ok_or_else(|| UnknownKey {
            key: shorten(s),
            suggestion: suggest_key(s),
        })
    }
}

/// A key that is not one of [`ConfigKey::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown config key `{key}`{}; `!config help` lists the keys",
    .suggestion.map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
pub struct UnknownKey {
    /// The key as typed (shortened if very long).
    pub key: String,
    /// The closest known key, if one is close.
    pub suggestion: Option<&'static str>,
}

/// A value that a key does not accept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad value `{value}` for `{key}`: expected {expected}")]
pub struct ValueError {
    /// The key.
    pub key: ConfigKey,
    /// The value as typed (shortened if very long).
    pub value: String,
    /// What the key accepts.
    pub expected: String,
}

/// Which end of its range a value was clamped to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClampLimit {
    /// The value was below the minimum.
    Min(u64),
    /// The value was above the maximum.
    Max(u64),
}

/// A value that was clamped while parsing, reported back to the owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClampNote {
    /// The key.
    pub key: ConfigKey,
    /// The value as typed.
    pub given: String,
    /// The value that is used instead.
    pub used: ConfigValue,
    /// The bound that applied.
    pub limit: ClampLimit,
}

impl fmt::Display for ClampNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (side, bound) = match self.limit {
            ClampLimit::Min(b) => ("below the minimum", b),
            ClampLimit::Max(b) => ("above the maximum", b),
        };
        let bound = match self.key.kind() {
            ValueKind::Duration => format_duration(bound),
            ValueKind::Budget => format_count(bound),
            _ => bound.to_string(),
        };
        write!(
            f,
            "{} {} is {side} {bound}; using {}",
            self.key, self.given, self.used
        )
    }
}

/// A typed configuration value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigValue {
    /// A responder policy.
    Responder(Responder),
    /// An allocation policy.
    Allocation(Allocation),
    /// An agent name; `None` is no agent.
    Agent(Option<String>),
    /// A duration in milliseconds.
    Millis(u64),
    /// A whole number.
    Count(u64),
    /// On or off.
    Flag(bool),
    /// A token budget; `None` is unlimited.
    Budget(Option<u64>),
    /// Agent names, sorted, without duplicates; empty is none.
    Agents(Vec<String>),
    /// Agent bindings, sorted, without duplicates; empty is none.
    Bindings(Vec<AgentBinding>),
    /// How group mentions are answered.
    GroupReply(GroupReply),
    /// A team shape.
    Topology(Topology),
    /// Writers' keys, sorted, without duplicates; empty is none.
    WriterKeys(Vec<RelayKey>),
}

impl ConfigValue {
    /// The value as stored in a `config.set` body (durations as whole milliseconds,
    /// an unlimited budget as `null`).
    pub fn to_json(&self) -> Value {
        match self {
            ConfigValue::Responder(r) => Value::from(r.as_str()),
            ConfigValue::Allocation(a) => Value::from(a.as_str()),
            ConfigValue::GroupReply(g) => Value::from(g.as_str()),
            ConfigValue::Topology(t) => Value::from(t.as_str()),
            ConfigValue::Agent(a) => a.as_deref().map(Value::from).unwrap_or(Value::Null),
            ConfigValue::Millis(n) | ConfigValue::Count(n) => Value::from(*n),
            ConfigValue::Flag(b) => Value::from(*b),
            ConfigValue::Budget(b) => b.map(Value::from).unwrap_or(Value::Null),
            ConfigValue::Agents(names) => Value::from(names.clone()),
            ConfigValue::Bindings(list) => {
                list.iter().map(|b| Value::from(b.to_string())).collect()
            }
            ConfigValue::WriterKeys(list) => {
                list.iter().map(|k| Value::from(k.to_string())).collect()
            }
        }
    }
}

impl fmt::Display for ConfigValue {
    /// The value as a person would type it in `!config`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigValue::Responder(r) => f.write_str(r.as_str()),
            ConfigValue::Allocation(a) => f.write_str(a.as_str()),
            ConfigValue::GroupReply(g) => f.write_str(g.as_str()),
            ConfigValue::Topology(t) => f.write_str(t.as_str()),
            ConfigValue::Agent(Some(a)) => f.write_str(a),
            ConfigValue::Agent(None) => f.write_str("none"),
            ConfigValue::Millis(ms) => f.write_str(&format_duration(*ms)),
            ConfigValue::Count(n) => write!(f, "{n}"),
            ConfigValue::Flag(b) => f.write_str(if *b { "on" } else { "off" }),
            ConfigValue::Budget(None) => f.write_str("unlimited"),
            ConfigValue::Budget(Some(n)) => f.write_str(&format_count(*n)),
            ConfigValue::Agents(names) if names.is_empty() => f.write_str("none"),
            ConfigValue::Agents(names) => f.write_str(&names.join(",")),
            ConfigValue::Bindings(list) if list.is_empty() => f.write_str("none"),
            ConfigValue::Bindings(list) => {
                let entries: Vec<String> = list.iter().map(AgentBinding::to_string).collect();
                f.write_str(&entries.join(","))
            }
            ConfigValue::WriterKeys(list) if list.is_empty() => f.write_str("none"),
            ConfigValue::WriterKeys(list) => {
                let entries: Vec<String> = list.iter().map(RelayKey::to_string).collect();
                f.write_str(&entries.join(","))
            }
        }
    }
}

impl RoomConfig {
    /// The value of one key.
    pub fn get(&self, key: ConfigKey) -> ConfigValue {
        match key {
            ConfigKey::Responder => ConfigValue::Responder(self.responder),
            ConfigKey::LeaseAhead => ConfigValue::Flag(self.lease_ahead),
            ConfigKey::CompactTurns => ConfigValue::Flag(self.compact_turns),
            ConfigKey::ResponderAgent => ConfigValue::Agent(self.responder_agent.clone()),
            ConfigKey::ResponderWindow => ConfigValue::Millis(self.responder_window_ms),
            ConfigKey::Allocation => ConfigValue::Allocation(self.allocation),
            ConfigKey::ClaimTtl => ConfigValue::Millis(self.claim_ttl_ms),
            ConfigKey::BidWindow => ConfigValue::Millis(self.bid_window_ms),
            ConfigKey::MaxAttempts => ConfigValue::Count(self.max_attempts.into()),
            ConfigKey::LoopMax => ConfigValue::Count(self.loop_max.into()),
            ConfigKey::LoopCooldown => ConfigValue::Millis(self.loop_cooldown_ms),
            ConfigKey::Rate => ConfigValue::Count(self.rate.into()),
            ConfigKey::RateWindow => ConfigValue::Millis(self.rate_window_ms),
            ConfigKey::RequireMention => ConfigValue::Flag(self.require_mention),
            ConfigKey::Budget => ConfigValue::Budget(self.budget),
            ConfigKey::MaxHops => ConfigValue::Count(self.max_hops.into()),
            ConfigKey::Delegators => ConfigValue::Agents(self.delegators.clone()),
            ConfigKey::Agents => ConfigValue::Bindings(self.agents.clone()),
            ConfigKey::GroupReply => ConfigValue::GroupReply(self.group_reply),
            ConfigKey::Topology => ConfigValue::Topology(self.topology),
            ConfigKey::ThreadContext => ConfigValue::Count(self.thread_context_bytes.into()),
            ConfigKey::ReplyHorizon => ConfigValue::Millis(self.reply_horizon_ms),
            ConfigKey::MaxReplyFailures => ConfigValue::Count(self.max_reply_failures.into()),
            ConfigKey::RelayKeys => ConfigValue::WriterKeys(self.relay_keys.clone()),
            ConfigKey::RequireSignatures => ConfigValue::Flag(self.require_signatures),
            ConfigKey::RetryBackoff => ConfigValue::Millis(self.retry_backoff_ms),
            ConfigKey::RetryBackoffMax => ConfigValue::Millis(self.retry_backoff_max_ms),
            ConfigKey::Breaker => ConfigValue::Count(self.breaker.into()),
            ConfigKey::BreakerCooldown => ConfigValue::Millis(self.breaker_cooldown_ms),
            ConfigKey::StallTimeout => ConfigValue::Millis(self.stall_timeout_ms),
            ConfigKey::ReviewRounds => ConfigValue::Count(self.review_rounds.into()),
            ConfigKey::LeaseDepth => ConfigValue::Count(self.lease_depth.into()),
        }
    }

    /// Sets one key, clamping numbers into the key's bounds. Returns `false` (and
    /// changes nothing) when the value is of the wrong kind for the key.
    pub fn set(&mut self, key: ConfigKey, value: ConfigValue) -> bool {
        let bounds = key.bounds().unwrap_or(Bounds {
            min: 0,
            max: u64::MAX,
        });
        let count = |n: u64| u32::try_from(bounds.clamp(n)).unwrap_or(u32::MAX);
        match (key, value) {
            (ConfigKey::Responder, ConfigValue::Responder(r)) => self.responder = r,
            (ConfigKey::ResponderAgent, ConfigValue::Agent(a)) => {
                self.responder_agent = a.filter(|a| check_agent_name(a).is_ok());
            }
            (ConfigKey::ResponderWindow, ConfigValue::Millis(n)) => {
                self.responder_window_ms = bounds.clamp(n)
            }
            (ConfigKey::Allocation, ConfigValue::Allocation(a)) => self.allocation = a,
            (ConfigKey::GroupReply, ConfigValue::GroupReply(g)) => self.group_reply = g,
            // Only recorded: the fold applies its preset beneath the explicit keys.
            (ConfigKey::Topology, ConfigValue::Topology(t)) => self.topology = t,
            (ConfigKey::ClaimTtl, ConfigValue::Millis(n)) => self.claim_ttl_ms = bounds.clamp(n),
            (ConfigKey::BidWindow, ConfigValue::Millis(n)) => self.bid_window_ms = bounds.clamp(n),
            (ConfigKey::MaxAttempts, ConfigValue::Count(n)) => self.max_attempts = count(n),
            (ConfigKey::ReviewRounds, ConfigValue::Count(n)) => self.review_rounds = count(n),
            (ConfigKey::LeaseDepth, ConfigValue::Count(n)) => self.lease_depth = count(n),
            (ConfigKey::LoopMax, ConfigValue::Count(n)) => self.loop_max = count(n),
            (ConfigKey::LoopCooldown, ConfigValue::Millis(n)) => {
                self.loop_cooldown_ms = bounds.clamp(n)
            }
            (ConfigKey::Rate, ConfigValue::Count(n)) => self.rate = count(n),
            (ConfigKey::RateWindow, ConfigValue::Millis(n)) => {
                self.rate_window_ms = bounds.clamp(n)
            }
            (ConfigKey::RequireMention, ConfigValue::Flag(b)) => self.require_mention = b,
            (ConfigKey::Budget, ConfigValue::Budget(b)) => self.budget = b.map(|n| bounds.clamp(n)),
            (ConfigKey::MaxHops, ConfigValue::Count(n)) => self.max_hops = count(n),
            (ConfigKey::ReplyHorizon, ConfigValue::Millis(n)) => {
                self.reply_horizon_ms = bounds.clamp(n)
            }
            (ConfigKey::MaxReplyFailures, ConfigValue::Count(n)) => {
                self.max_reply_failures = count(n)
            }
            (ConfigKey::ThreadContext, ConfigValue::Count(n)) => {
                self.thread_context_bytes = count(n)
            }
            (ConfigKey::Delegators, ConfigValue::Agents(names)) => {
                let ConfigValue::Agents(names) =
                    agent_list(names).unwrap_or(ConfigValue::Agents(Vec::new()))
                else {
                    return false;
                };
                self.delegators = names;
            }
            (ConfigKey::Agents, ConfigValue::Bindings(list)) => {
                let valid = list.iter().all(|b| {
                    check_agent_name(&b.agent).is_ok() && check_writer_name(&b.writer).is_ok()
                });
                self.agents = normalized(list).filter(|_| valid).unwrap_or_default();
            }
            (ConfigKey::RelayKeys, ConfigValue::WriterKeys(list)) => {
                let valid = list.iter().all(|k| check_writer_name(&k.writer).is_ok());
                self.relay_keys = normalized(list).filter(|_| valid).unwrap_or_default();
            }
            (ConfigKey::RequireSignatures, ConfigValue::Flag(b)) => self.require_signatures = b,
            (ConfigKey::LeaseAhead, ConfigValue::Flag(b)) => self.lease_ahead = b,
            (ConfigKey::CompactTurns, ConfigValue::Flag(b)) => self.compact_turns = b,
            (ConfigKey::RetryBackoff, ConfigValue::Millis(n)) => {
                self.retry_backoff_ms = bounds.clamp(n)
            }
            (ConfigKey::RetryBackoffMax, ConfigValue::Millis(n)) => {
                self.retry_backoff_max_ms = bounds.clamp(n)
            }
            (ConfigKey::Breaker, ConfigValue::Count(n)) => self.breaker = count(n),
            (ConfigKey::BreakerCooldown, ConfigValue::Millis(n)) => {
                self.breaker_cooldown_ms = bounds.clamp(n)
            }
            (ConfigKey::StallTimeout, ConfigValue::Millis(n)) => {
                self.stall_timeout_ms = bounds.clamp(n)
            }
            _ => return false,
        }
        true
    }

    /// The read-side clamp: every numeric field forced into its key's bounds and an
    /// invalid `responder_agent` dropped. Whatever produced this config (a fold over
    /// hand-written rows, a deserialised file), the result is within the clamps.
    pub fn clamped(&self) -> RoomConfig {
        let mut out = RoomConfig::default();
        for key in ConfigKey::ALL {
            out.set(key, self.get(key));
        }
        out
    }

    /// Whether every value lies inside its key's clamps (what [`Self::clamped`]
    /// guarantees).
    pub fn is_within_clamps(&self) -> bool {
        self == &self.clamped()
    }
}

/// The body of a `config.set` interaction.
///
/// ```json
/// {"set": {"rate": 5, "loop-cooldown": 120000, "responder": "designated"},
///  "reset": ["max-hops"]}
/// ```
///
/// The scope is the interaction's own `room` / `thread`: a row without a thread is
/// the room overlay, a row in a thread is that thread's overlay. Both members are
/// optional (absent means empty) but together name at least one key, and no key may
/// appear in both. Values: durations as whole milliseconds, counts as whole numbers,
/// `require-mention` as a boolean, `budget` as whole tokens or `null` (unlimited),
/// the others as their text. Unknown keys are skipped (a newer writer's keys); a
/// known key with a value of the wrong type makes the whole row ignored. Other
/// members (e.g. `"command"`, the text that produced it) are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigSetBody {
    /// Keys set, with their values.
    pub set: BTreeMap<ConfigKey, ConfigValue>,
    /// Keys cleared (the scope falls back to the room, then the default).
    pub reset: BTreeSet<ConfigKey>,
}

impl ConfigSetBody {
    /// The JSON body.
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::Map::new();
        if !self.set.is_empty() {
            let set: serde_json::Map<String, Value> = self
                .set
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_json()))
                .collect();
            body.insert("set".into(), Value::Object(set));
        }
        if !self.reset.is_empty() {
            let reset: Vec<Value> = self.reset.iter().map(|k| Value::from(k.as_str())).collect();
            body.insert("reset".into(), Value::Array(reset));
        }
        Value::Object(body)
    }

    /// Reads and checks a body. The error says why the row is ignored.
    pub fn from_json(body: &Value) -> Result<ConfigSetBody, String> {
        let obj = body.as_object().ok_or("body is not an object")?;
        let mut out = ConfigSetBody::default();
        match obj.get("set") {
            None => {}
            Some(Value::Object(set)) => {
                for (k, v) in set {
                    if let Ok(key) = k.parse::<ConfigKey>() {
                        out.set.insert(key, key.value_from_json(v)?);
                    }
                }
            }
            Some(_) => return Err("`set` is not an object".into()),
        }
        match obj.get("reset") {
            None => {}
            Some(Value::Array(reset)) => {
                for k in reset {
                    let k = k.as_str().ok_or("`reset` holds a non-string")?;
                    if let Ok(key) = k.parse::<ConfigKey>() {
                        out.reset.insert(key);
                    }
                }
            }
            Some(_) => return Err("`reset` is not an array".into()),
        }
        if let Some(k) = out.set.keys().find(|k| out.reset.contains(k)) {
            return Err(format!("`{k}` is both set and reset"));
        }
        if out.set.is_empty() && out.reset.is_empty() {
            return Err("names no known key".into());
        }
        Ok(out)
    }
}

/// Most agents one `delegators` value may name.
pub const MAX_DELEGATORS: usize = 64;

/// A list of agent names as a value: every name valid, at most [`MAX_DELEGATORS`],
/// sorted and deduplicated. `None` when a name is invalid or the list too long.
fn agent_list(mut names: Vec<String>) -> Option<ConfigValue> {
    if names.len() > MAX_DELEGATORS || names.iter().any(|n| check_agent_name(n).is_err()) {
        return None;
    }
    names.sort();
    names.dedup();
    Some(ConfigValue::Agents(names))
}

impl RoomConfig {
    /// Whether `agent` may create tasks with `task_delegate` (the `delegators` key).
    pub fn may_delegate(&self, agent: &str) -> bool {
        self.delegators.iter().any(|d| d == agent)
    }
}

/// Checks an agent name: a valid actor name (see [`validate_name`]) without white
/// space or `@`.
pub fn check_agent_name(name: &str) -> Result<(), String> {
    validate_name("agent", name, &Limits::default()).map_err(|e| e.to_string())?;
    if name.chars().any(|c| c.is_whitespace() || c == '@') {
        return Err("agent names have no spaces or '@'".into());
    }
    Ok(())
}

/// A parsed number that may be negative or huge; clamped into a [`Bounds`].
#[derive(Clone, Copy, Debug)]
struct Signed {
    negative: bool,
    magnitude: u64,
}

impl Signed {
    fn clamp_into(self, b: Bounds) -> (u64, Option<ClampLimit>) {
        if (self.negative && self.magnitude > 0) || self.magnitude < b.min {
            (b.min, Some(ClampLimit::Min(b.min)))
        } else if self.magnitude > b.max {
            (b.max, Some(ClampLimit::Max(b.max)))
        } else {
            (self.magnitude, None)
        }
    }
}

/// Splits an optional sign off `text`.
fn split_sign(text: &str) -> (bool, &str) {
    match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    }
}

/// Parses `digits[.digits]` at the start of `s`: returns the value times `scale`
/// (saturating, fraction truncated) and the rest of `s`.
fn scaled_decimal(s: &str, scale: u64) -> Option<(u64, &str)> {
    let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, rest) = s.split_at(int_len);
    let (frac_part, rest) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            if n == 0 {
                return None;
            }
            r.split_at(n)
        }
        None => ("", rest),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let mut int: u128 = 0;
    for d in int_part.bytes() {
        int = (int * 10 + u128::from(d - b'0')).min(u128::from(u64::MAX));
    }
    let mut value = int.saturating_mul(u128::from(scale));
    // Nine fraction digits are more precision than any scale here can use.
    let mut frac: u128 = 0;
    let mut denom: u128 = 1;
    for d in frac_part.bytes().take(9) {
        frac = frac * 10 + u128::from(d - b'0');
        denom *= 10;
    }
    value = value.saturating_add(frac * u128::from(scale) / denom);
    Some((u64::try_from(value).unwrap_or(u64::MAX), rest))
}

/// Parses a whole number (`rate`, `loop-max`, ...) or, with `suffixes`, a token
/// count that may end in `k`, `M` or `G` (`200k`, `1.5M`). Underscores are allowed
/// between digits. Huge values saturate; the caller clamps.
fn parse_number(text: &str, suffixes: bool) -> Result<Signed, ()> {
    let cleaned: String = text.chars().filter(|c| *c != '_').collect();
    let (negative, s) = split_sign(&cleaned);
    let (scale, s) = match s.char_indices().last() {
        Some((i, c)) if suffixes && matches!(c, 'k' | 'K') => (1_000, &s[..i]),
        Some((i, c)) if suffixes && matches!(c, 'm' | 'M') => (1_000_000, &s[..i]),
        Some((i, c)) if suffixes && matches!(c, 'g' | 'G') => (1_000_000_000, &s[..i]),
        _ => (1, s),
    };
    if scale == 1 && s.contains('.') {
        return Err(());
    }
    match scaled_decimal(s, scale) {
        Some((magnitude, "")) => Ok(Signed {
            negative,
            magnitude,
        }),
        _ => Err(()),
    }
}

fn parse_duration_signed(text: &str) -> Result<Signed, String> {
    let (negative, s) = split_sign(text);
    parse_duration(s).map(|magnitude| Signed {
        negative,
        magnitude,
    })
}

/// Parses a duration into milliseconds: one or more `number unit` parts, where the
/// number may have a fraction and the unit is `ms`, `s`, `m` or `h`: `500ms`,
/// `30s`, `2m`, `1h`, `1.5s`, `1m30s`. A bare `0` is zero. Huge values saturate.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    if text == "0" {
        return Ok(0);
    }
    let mut rest = text;
    let mut total: u64 = 0;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        // Parse the number with scale 1,000,000,000 (nano-units) to keep the fraction,
        // then convert by the unit.
        let digits = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        if digits == 0 {
            return Err(format!("expected a number in {text:?}"));
        }
        let unit_len = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        let unit = &rest[digits..digits + unit_len];
        let unit_ms = match unit {
            "ms" => 1,
            "s" | "sec" => SECOND,
            "m" | "min" => MINUTE,
            "h" => HOUR,
            "" => return Err(format!("{text:?} needs a unit: ms, s, m or h")),
            other => return Err(format!("unknown unit {other:?}: use ms, s, m or h")),
        };
        match scaled_decimal(&rest[..digits], unit_ms) {
            Some((ms, "")) => total = total.saturating_add(ms),
            _ => return Err(format!("bad number in {text:?}")),
        }
        rest = &rest[digits + unit_len..];
    }
    Ok(total)
}

/// Formats milliseconds the way [`parse_duration`] reads them: `250ms`, `1.5s`,
/// `30s`, `2m`, `1h`.
pub fn format_duration(ms: u64) -> String {
    if ms < SECOND {
        format!("{ms}ms")
    } else if exact(ms, HOUR) {
        format!("{}h", ms / HOUR)
    } else if exact(ms, MINUTE) {
        format!("{}m", ms / MINUTE)
    } else if exact(ms, SECOND) {
        format!("{}s", ms / SECOND)
    } else {
        let frac = format!("{:03}", ms % SECOND);
        format!("{}.{}s", ms / SECOND, frac.trim_end_matches('0'))
    }
}

/// Whether `unit` divides `n` (spelled without `%` so the MSRV needs no
/// `is_multiple_of`).
fn exact(n: u64, unit: u64) -> bool {
    n / unit * unit == n
}

/// Formats a token count with a `k` / `M` / `G` suffix when exact.
fn format_count(n: u64) -> String {
    for (scale, suffix) in [(1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")] {
        if n >= scale && exact(n, scale) {
            return format!("{}{suffix}", n / scale);
        }
    }
    n.to_string()
}

/// Shortens user text for an error message (at most 64 characters).
pub(crate) fn shorten(text: &str) -> String {
    const MAX: usize = 64;
    if text.chars().count() <= MAX {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(MAX).collect();
        s.push('…');
        s
    }
}

/// The known key closest to `typed` (edit distance at most 2, or a unique prefix).
fn suggest_key(typed: &str) -> Option<&'static str> {
    if typed.len() > 64 {
        return None;
    }
    let typed = typed.to_ascii_lowercase();
    if let Some(k) = ConfigKey::from_name(&typed.replace('_', "-")) {
        return Some(k.as_str());
    }
    let prefixed: Vec<_> = ConfigKey::ALL
        .into_iter()
        .filter(|k| !typed.is_empty() && k.as_str().starts_with(&typed))
        .collect();
    if prefixed.len() == 1 {
        return Some(prefixed[0].as_str());
    }
    ConfigKey::ALL
        .into_iter()
        .map(|k| (edit_distance(&typed, k.as_str()), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k.as_str())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(key: ConfigKey, text: &str) -> (ConfigValue, Option<String>) {
        let (v, note) = key.parse_value(text).unwrap();
        (v, note.map(|n| n.to_string()))
    }

    #[test]
    fn durations_parse_in_every_unit() {
        for (text, ms) in [
            ("500ms", 500),
            ("30s", 30_000),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1.5s", 1_500),
            ("1m30s", 90_000),
            ("0.25m", 15_000),
            ("2min", 120_000),
            ("10sec", 10_000),
            ("0", 0),
        ] {
            assert_eq!(parse_duration(text), Ok(ms), "{text}");
        }
        for bad in [
            "", "30", "5x", "s", "1..5s", "1.s", "ms", "3 s", "1h-2m", "-",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_duration("30").unwrap_err(),
            "\"30\" needs a unit: ms, s, m or h"
        );
        // Saturates instead of overflowing.
        assert_eq!(parse_duration("99999999999999999999999h"), Ok(u64::MAX));
    }

    #[test]
    fn durations_format_the_way_they_parse() {
        for (ms, text) in [
            (0, "0ms"),
            (250, "250ms"),
            (1_500, "1.5s"),
            (1_250, "1.25s"),
            (30_000, "30s"),
            (90_000, "90s"),
            (120_000, "2m"),
            (3_600_000, "1h"),
        ] {
            assert_eq!(format_duration(ms), text);
            assert_eq!(parse_duration(text), Ok(ms));
        }
    }

    #[test]
    fn numbers_are_clamped_and_the_clamp_is_reported() {
        assert_eq!(
            parse(ConfigKey::Rate, "0"),
            (
                ConfigValue::Count(1),
                Some("rate 0 is below the minimum 1; using 1".into())
            )
        );
        assert_eq!(
            parse(ConfigKey::LoopMax, "-3"),
            (
                ConfigValue::Count(1),
                Some("loop-max -3 is below the minimum 1; using 1".into())
            )
        );
        assert_eq!(
            parse(ConfigKey::ClaimTtl, "2h"),
            (
                ConfigValue::Millis(3_600_000),
                Some("claim-ttl 2h is above the maximum 1h; using 1h".into())
            )
        );
        assert_eq!(
            parse(ConfigKey::ClaimTtl, "500ms"),
            (
                ConfigValue::Millis(1_000),
                Some("claim-ttl 500ms is below the minimum 1s; using 1s".into())
            )
        );
        assert_eq!(
            parse(ConfigKey::Rate, "99999999999999999999999999"),
            (
                ConfigValue::Count(1_000),
                Some(
                    "rate 99999999999999999999999999 is above the maximum 1000; using 1000".into()
                )
            )
        );
        assert_eq!(
            parse(ConfigKey::LoopCooldown, "0"),
            (
                ConfigValue::Millis(1_000),
                Some("loop-cooldown 0 is below the minimum 1s; using 1s".into())
            )
        );
        // In range: no note.
        assert_eq!(parse(ConfigKey::Rate, "5"), (ConfigValue::Count(5), None));
        assert_eq!(
            parse(ConfigKey::MaxHops, "0"),
            (ConfigValue::Count(0), None)
        );
        assert_eq!(
            parse(ConfigKey::ResponderWindow, "1.5s"),
            (ConfigValue::Millis(1_500), None)
        );
    }

    #[test]
    fn every_kind_of_value_parses() {
        assert_eq!(
            parse(ConfigKey::Responder, "role-priority").0,
            ConfigValue::Responder(Responder::RolePriority)
        );
        assert_eq!(
            parse(ConfigKey::Allocation, "BID").0,
            ConfigValue::Allocation(Allocation::Bid)
        );
        assert_eq!(
            parse(ConfigKey::ResponderAgent, "@ana").0,
            ConfigValue::Agent(Some("ana".into()))
        );
        assert_eq!(
            parse(ConfigKey::ResponderAgent, "none").0,
            ConfigValue::Agent(None)
        );
        assert_eq!(
            parse(ConfigKey::RequireMention, "on").0,
            ConfigValue::Flag(true)
        );
        assert_eq!(
            parse(ConfigKey::RequireMention, "no").0,
            ConfigValue::Flag(false)
        );
        assert_eq!(
            parse(ConfigKey::Budget, "200k").0,
            ConfigValue::Budget(Some(200_000))
        );
        assert_eq!(
            parse(ConfigKey::Budget, "1.5M").0,
            ConfigValue::Budget(Some(1_500_000))
        );
        assert_eq!(
            parse(ConfigKey::Budget, "1_000").0,
            ConfigValue::Budget(Some(1_000))
        );
        assert_eq!(
            parse(ConfigKey::Budget, "unlimited").0,
            ConfigValue::Budget(None)
        );
    }

    #[test]
    fn bad_values_say_what_is_expected() {
        let err = |k: ConfigKey, v: &str| k.parse_value(v).unwrap_err().to_string();
        assert_eq!(
            err(ConfigKey::Responder, "first"),
            "bad value `first` for `responder`: expected race, designated or role-priority"
        );
        assert_eq!(
            err(ConfigKey::ClaimTtl, "30"),
            "bad value `30` for `claim-ttl`: expected a duration such as 500ms, 30s, 2m or \
             1h, from 1s to 1h"
        );
        assert_eq!(
            err(ConfigKey::Rate, "1.5"),
            "bad value `1.5` for `rate`: expected a whole number from 1 to 1000"
        );
        assert_eq!(
            err(ConfigKey::RequireMention, "maybe"),
            "bad value `maybe` for `require-mention`: expected on or off"
        );
        assert!(ConfigKey::ResponderAgent.parse_value("a/b").is_err());
        assert!(ConfigKey::Budget.parse_value("5T").is_err());
        assert!(ConfigKey::Budget.parse_value("k").is_err());
    }

    #[test]
    fn unknown_keys_suggest_the_nearest() {
        let e = "rat".parse::<ConfigKey>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown config key `rat` (did you mean `rate`?); `!config help` lists the keys"
        );
        assert_eq!(
            "claim_ttl".parse::<ConfigKey>().unwrap_err().suggestion,
            Some("claim-ttl")
        );
        assert_eq!("resp".parse::<ConfigKey>().unwrap_err().suggestion, None);
        assert_eq!(
            "bid-w".parse::<ConfigKey>().unwrap_err().suggestion,
            Some("bid-window")
        );
        assert_eq!(
            "zzzzzzzz".parse::<ConfigKey>().unwrap_err().suggestion,
            None
        );
    }

    #[test]
    fn every_key_round_trips_its_default_through_text_and_json() {
        for key in ConfigKey::ALL {
            assert_eq!(key.as_str().parse::<ConfigKey>(), Ok(key));
            let default = key.default_value();
            let (parsed, note) = key.parse_value(&default.to_string()).unwrap();
            assert_eq!(parsed, default, "{key}");
            assert_eq!(note, None, "{key}");
            assert_eq!(key.value_from_json(&default.to_json()), Ok(default));
            if let Some(b) = key.bounds() {
                assert!(b.min <= b.max);
            }
        }
        assert!(RoomConfig::default().is_within_clamps());
    }

    #[test]
    fn config_set_bodies_round_trip_and_bad_ones_are_refused() {
        let mut body = ConfigSetBody::default();
        body.set.insert(ConfigKey::Rate, ConfigValue::Count(5));
        body.set
            .insert(ConfigKey::LoopCooldown, ConfigValue::Millis(120_000));
        body.set
            .insert(ConfigKey::Budget, ConfigValue::Budget(None));
        body.reset.insert(ConfigKey::MaxHops);
        let json = body.to_json();
        assert_eq!(
            json,
            json!({"set": {"rate": 5, "loop-cooldown": 120000, "budget": null},
                   "reset": ["max-hops"]})
        );
        assert_eq!(ConfigSetBody::from_json(&json), Ok(body));

        let refused = [
            json!("rate 5"),
            json!({}),
            json!({"set": []}),
            json!({"reset": "rate"}),
            json!({"reset": [1]}),
            json!({"set": {"rate": "five"}}),
            json!({"set": {"rate": 1.5}}),
            json!({"set": {"rate": 5}, "reset": ["rate"]}),
            json!({"set": {"responder": "boss"}}),
            json!({"set": {"unknown-key": 1}}),
        ];
        for body in refused {
            assert!(ConfigSetBody::from_json(&body).is_err(), "{body}");
        }
        // Unknown keys are skipped beside known ones; negatives read as 0.
        let mixed = ConfigSetBody::from_json(&json!({"set": {"future": 1, "rate": -4}})).unwrap();
        assert_eq!(mixed.set.len(), 1);
        assert_eq!(mixed.set[&ConfigKey::Rate], ConfigValue::Count(0));
    }

    fn any_key() -> impl Strategy<Value = ConfigKey> {
        prop::sample::select(ConfigKey::ALL.to_vec())
    }

    fn any_value() -> impl Strategy<Value = ConfigValue> {
        prop_oneof![
            prop::sample::select(Responder::ALL.to_vec()).prop_map(ConfigValue::Responder),
            prop::sample::select(Allocation::ALL.to_vec()).prop_map(ConfigValue::Allocation),
            proptest::option::of("[a-z/@ ]{0,4}").prop_map(ConfigValue::Agent),
            any::<u64>().prop_map(ConfigValue::Millis),
            any::<u64>().prop_map(ConfigValue::Count),
            any::<bool>().prop_map(ConfigValue::Flag),
            proptest::option::of(any::<u64>()).prop_map(ConfigValue::Budget),
            prop::collection::vec("[a-z@ ]{0,4}", 0..4).prop_map(ConfigValue::Agents),
            prop::collection::vec(("[a-z@ ]{0,3}", "[a-z@, ]{0,3}"), 0..4).prop_map(|l| {
                ConfigValue::Bindings(
                    l.into_iter()
                        .map(|(agent, writer)| AgentBinding { agent, writer })
                        .collect(),
                )
            }),
        ]
    }

    proptest! {
        #[test]
        fn parsed_values_are_always_inside_their_clamps(key in any_key(), text in "\\PC{0,24}|-?[0-9_.]{1,30}(ms|s|m|h|k|M)?") {
            if let Ok((value, note)) = key.parse_value(&text) {
                prop_assert_eq!(key.clamp(value.clone()), value.clone());
                let mut config = RoomConfig::default();
                prop_assert!(config.set(key, value.clone()));
                prop_assert!(config.is_within_clamps());
                if let Some(note) = note {
                    prop_assert_eq!(note.used, value);
                }
            }
        }

        #[test]
        fn any_assignment_reads_back_inside_the_clamps(writes in prop::collection::vec((any_key(), any_value()), 0..20)) {
            let mut config = RoomConfig::default();
            for (k, v) in writes {
                config.set(k, v);
            }
            prop_assert!(config.is_within_clamps());
            // A config built field by field, bypassing set, is clamped on read.
            let wild = RoomConfig {
                claim_ttl_ms: 0,
                rate: 0,
                loop_max: 0,
                max_hops: u32::MAX,
                responder_agent: Some("bad name".into()),
                ..config
            };
            prop_assert!(wild.clamped().is_within_clamps());
            prop_assert!(!wild.is_within_clamps());
        }

        #[test]
        fn durations_round_trip(ms in 0u64..100_000_000_000) {
            prop_assert_eq!(parse_duration(&format_duration(ms)), Ok(ms));
        }
    }
}

#[cfg(test)]
mod doc_tests {
    use super::*;

    /// The key table in the protocol docs matches the code: every key, its default
    /// and its range.
    #[test]
    fn docs_list_every_key_with_its_default_and_range() {
        let docs = include_str!("../../../../docs/protocol/commands.md");
        for key in ConfigKey::ALL {
            let prefix = format!("| `{key}` |");
            let row = docs
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("docs/protocol/commands.md has no row for {key}"));
            let default = key.default_value().to_string();
            assert!(
                row.contains(&format!("| {default} |")),
                "{key}: default {default} in {row}"
            );
            if let Some(b) = key.bounds() {
                let show = |n| match key.kind() {
                    ValueKind::Duration => format_duration(n),
                    ValueKind::Budget => format_count(n),
                    _ => n.to_string(),
                };
                let range = format!("{} – {}", show(b.min), show(b.max));
                assert!(row.contains(&range), "{key}: range {range} in {row}");
            }
        }
    }
}
