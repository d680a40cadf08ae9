//! Relay presence and the named agents a room is waiting for.
//!
//! [`RelayFold`] folds, per room, the latest `relay.heartbeat` of every relay (what it
//! hosts, its version, how far behind it was) and the messages that name agents
//! (mentions and `@@cap` groups) whose named agents have not answered yet. Whether a
//! relay is alive *now* is not in the ledger: it is its `relay/<id>` lease, judged by
//! the database clock. Readers ([`RoomRelays::agent_online`], [`RoomRelays::waiting`])
//! take the set of relays whose lease is live and join the two, so the board can say
//! "ada is offline" and "message 1a2b… waits on ada, whom no live relay hosts" instead
//! of waiting silently.
//!
//! Determinism: a heartbeat counts only from its own relay (actor = the body's relay,
//! role `system`) and the latest in ledger order wins; awaited messages are kept in
//! ledger order, at most [`MAX_AWAITED`] per room (the oldest forgotten first).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::fold::{hash_state, Fold};
use crate::model::{Interaction, InteractionId, Role, Timestamp};
use crate::protocol::relay::RelayHeartbeatBody;
use crate::protocol::{parse_body, AgentRegisteredBody, MessageBody, TurnRepliedBody};
use crate::sync::addressing;
use crate::verbs::Verb;

/// Most messages per room whose named agents are awaited.
pub const MAX_AWAITED: usize = 256;

/// A relay's latest heartbeat in a room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelaySeen {
    /// The heartbeat.
    pub heartbeat: RelayHeartbeatBody,
    /// When it was written (database time).
    pub at: Timestamp,
}

/// A message whose named agents have not all answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Awaited {
    /// Its author.
    pub author: String,
    /// When it was posted.
    pub at: Timestamp,
    /// The agents it names (mentions and group members), sorted.
    pub named: BTreeSet<String>,
    /// Whether it names agents only through `@@cap` groups (one reply from the group
    /// suffices under `group-reply one`).
    pub group_only: bool,
    /// Named agents that answered it.
    pub replied: BTreeSet<String>,
}

impl Awaited {
    /// The named agents that still owe an answer (none once any member answered a
    /// group-only message under `group-reply one`).
    pub fn owed(&self, group_one: bool) -> Vec<&str> {
        if group_one && self.group_only && !self.replied.is_empty() {
            return Vec::new();
        }
        self.named
            .iter()
            .filter(|a| !self.replied.contains(*a))
            .map(String::as_str)
            .collect()
    }
}

/// One room's relays and awaited messages.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomRelays {
    /// Latest heartbeat per relay id.
    pub relays: BTreeMap<String, RelaySeen>,
    /// Registered agents and their capabilities (for group mentions).
    agents: BTreeMap<String, Vec<String>>,
    /// Messages naming agents, by id (hex), with their ledger order in `order`.
    awaited: BTreeMap<String, Awaited>,
    order: VecDeque<String>,
}

/// How an agent is hosted, as far as heartbeats and leases tell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hosting {
    /// A relay whose lease is live hosts it.
    Online,
    /// Every relay whose latest heartbeat lists it has a lapsed lease (sorted ids).
    Offline(Vec<String>),
    /// No heartbeat lists it (an agent acting for itself, or relays that predate
    /// heartbeats): nothing is known.
    Unknown,
}

/// A message waiting on absent agents: its id (hex), what is awaited, and each absent
/// named agent with how it is hosted.
pub type AbsentWait<'a> = (&'a str, &'a Awaited, Vec<(String, Hosting)>);

impl RoomRelays {
    /// Relays whose latest heartbeat lists `agent`, sorted.
    pub fn hosts_of(&self, agent: &str) -> Vec<&str> {
        self.relays
            .iter()
            .filter(|(_, s)| s.heartbeat.agents.iter().any(|a| a == agent))
            .map(|(r, _)| r.as_str())
            .collect()
    }

    /// How `agent` is hosted, given the relay ids whose lease is live.
    pub fn hosting(&self, agent: &str, live: &BTreeSet<String>) -> Hosting {
        let hosts = self.hosts_of(agent);
        if hosts.is_empty() {
            Hosting::Unknown
        } else if hosts.iter().any(|h| live.contains(*h)) {
            Hosting::Online
        } else {
            Hosting::Offline(hosts.into_iter().map(str::to_string).collect())
        }
    }

    /// Messages still owed an answer by a named agent that no live relay hosts, oldest
    /// first: `(message hex, awaited, absent agents with how they are hosted)`.
    pub fn waiting_on_absent(
        &self,
        live: &BTreeSet<String>,
        group_one: bool,
    ) -> Vec<AbsentWait<'_>> {
        self.order
            .iter()
            .filter_map(|id| self.awaited.get(id).map(|a| (id.as_str(), a)))
            .filter_map(|(id, a)| {
                let absent: Vec<(String, Hosting)> = a
                    .owed(group_one)
                    .into_iter()
                    .map(|agent| (agent.to_string(), self.hosting(agent, live)))
                    .filter(|(_, h)| *h != Hosting::Online)
                    .collect();
                (!absent.is_empty()).then_some((id, a, absent))
            })
            .collect()
    }

    /// Every awaited message, oldest first.
    pub fn awaited(&self) -> impl Iterator<Item = (&str, &Awaited)> {
        self.order
            .iter()
            .filter_map(|id| self.awaited.get(id).map(|a| (id.as_str(), a)))
    }

    fn answered(&mut self, message: &InteractionId, agent: &str) {
        let key = message.to_hex();
        if let Some(a) = self.awaited.get_mut(&key) {
            if a.named.contains(agent) {
                a.replied.insert(agent.to_string());
            }
            if a.named.iter().all(|n| a.replied.contains(n)) {
                self.awaited.remove(&key);
                self.order.retain(|k| *k != key);
            }
        }
    }

    fn apply(&mut self, i: &Interaction) {
        match i.verb {
            Verb::RelayHeartbeat if i.role == Role::System => {
                if let Some(b) = RelayHeartbeatBody::parse(&i.body).filter(|b| b.relay == i.actor) {
                    self.relays.insert(
                        b.relay.clone(),
                        RelaySeen {
                            heartbeat: b,
                            at: i.at,
                        },
                    );
                }
            }
            Verb::AgentRegistered if i.role == Role::Agent => {
                let b: AgentRegisteredBody = parse_body(&i.body).unwrap_or_default();
                self.agents.insert(i.actor.clone(), b.capabilities);
            }
            Verb::MessagePosted => {
                if i.role == Role::Agent {
                    if let Some(p) = i.parent {
                        self.answered(&p, &i.actor);
                    }
                }
                let body: MessageBody = parse_body(&i.body).unwrap_or_default();
                let to =
                    addressing::address_in_room(&body.text, &body.mentions, None, &self.agents);
                let eligible = addressing::eligible(&i.actor, i.role, &body.text, &to, false);
                let addressing::Eligible::Agents(named) = eligible else {
                    return;
                };
                if named.is_empty() {
                    return;
                }
                let known: BTreeSet<String> = self.agents.keys().cloned().collect();
                let group_only = addressing::group_only(&body.text, &body.mentions, &known);
                let key = i.id.to_hex();
                if self.awaited.contains_key(&key) {
                    return;
                }
                self.awaited.insert(
                    key.clone(),
                    Awaited {
                        author: i.actor.clone(),
                        at: i.at,
                        named: named.into_iter().collect(),
                        group_only,
                        replied: BTreeSet::new(),
                    },
                );
                self.order.push_back(key);
                while self.order.len() > MAX_AWAITED {
                    if let Some(old) = self.order.pop_front() {
                        self.awaited.remove(&old);
                    }
                }
            }
            Verb::TurnReplied if i.role == Role::Agent => {
                if let Some(b) = parse_body::<TurnRepliedBody>(&i.body) {
                    if let Ok(id) = b.subject.id.parse::<InteractionId>() {
                        self.answered(&id, &i.actor);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The relay-presence fold over every room. See the [module docs](self).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayFold {
    rooms: BTreeMap<String, RoomRelays>,
}

impl RelayFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// A room's relays, if any row of it was folded.
    pub fn room(&self, room: &str) -> Option<&RoomRelays> {
        self.rooms.get(room)
    }

    /// Every room folded, with its relays.
    pub fn rooms(&self) -> impl Iterator<Item = (&str, &RoomRelays)> {
        self.rooms.iter().map(|(r, s)| (r.as_str(), s))
    }
}

impl Fold for RelayFold {
    fn apply(&mut self, i: &Interaction) {
        if matches!(
            i.verb,
            Verb::RelayHeartbeat | Verb::AgentRegistered | Verb::MessagePosted | Verb::TurnReplied
        ) {
            self.rooms.entry(i.room.clone()).or_default().apply(i);
        }
    }

    fn state_hash(&self) -> [u8; 32] {
        hash_state(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ix, Ledger};
    use serde_json::json;

    fn row(
        _room: &str,
        verb: Verb,
        actor: &str,
        role: Role,
        body: serde_json::Value,
    ) -> Interaction {
        thread_local! { static L: std::cell::RefCell<Ledger> = Default::default(); }
        L.with(|l| {
            let mut l = l.borrow_mut();
            let at = Timestamp(l.rows.len() as i64 * 1_000);
            l.push(ix(verb, actor, role, body), at)
        })
    }

    fn heartbeat(relay: &str, agents: &[&str], beat: u64) -> Interaction {
        let body = RelayHeartbeatBody {
            relay: relay.into(),
            instance: format!("{relay}@h/pid1/1"),
            beat,
            version: "0.1.0".into(),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            behind: 0,
        };
        row(
            "lobby",
            Verb::RelayHeartbeat,
            relay,
            Role::System,
            body.to_body(),
        )
    }

    fn live(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn agents_are_online_offline_or_unknown_by_their_relays_leases() {
        let mut f = RelayFold::new();
        f.apply(&heartbeat("r0", &["ada", "bo"], 0));
        f.apply(&heartbeat("r1", &["bo"], 0));
        // A heartbeat written by someone else for r0 does not count.
        let mut forged = heartbeat("r0", &["zed"], 1);
        forged.actor = "mallory".into();
        f.apply(&forged);
        let r = f.room("lobby").unwrap();
        assert_eq!(r.hosting("ada", &live(&["r0"])), Hosting::Online);
        assert_eq!(
            r.hosting("ada", &live(&["r1"])),
            Hosting::Offline(vec!["r0".into()])
        );
        assert_eq!(r.hosting("bo", &live(&["r1"])), Hosting::Online);
        assert_eq!(r.hosting("zed", &live(&["r0"])), Hosting::Unknown);
        // The latest heartbeat of a relay replaces what it hosts.
        f.apply(&heartbeat("r0", &["bo"], 1));
        let r = f.room("lobby").unwrap();
        assert_eq!(r.hosting("ada", &live(&["r0"])), Hosting::Unknown);
    }

    #[test]
    fn messages_wait_on_named_agents_until_each_answers() {
        let mut f = RelayFold::new();
        for a in ["ada", "bo"] {
            f.apply(&row(
                "lobby",
                Verb::AgentRegistered,
                a,
                Role::Agent,
                json!({"capabilities": ["review"]}),
            ));
        }
        f.apply(&heartbeat("r0", &["ada"], 0));
        f.apply(&heartbeat("r1", &["bo"], 0));
        let q = row(
            "lobby",
            Verb::MessagePosted,
            "hank",
            Role::Human,
            json!({"text": "@ada @bo please"}),
        );
        f.apply(&q);
        let g = row(
            "lobby",
            Verb::MessagePosted,
            "hank",
            Role::Human,
            json!({"text": "@@review anyone"}),
        );
        f.apply(&g);
        let r = f.room("lobby").unwrap();
        let absent = r.waiting_on_absent(&live(&["r0"]), false);
        assert_eq!(absent.len(), 2, "bo (r1 offline) owes both");
        assert_eq!(
            absent[0].2,
            vec![("bo".into(), Hosting::Offline(vec!["r1".into()]))]
        );
        assert!(r.waiting_on_absent(&live(&["r0", "r1"]), false).is_empty());
        // ada answers both: under group-reply one the group message is done.
        let mut reply = row(
            "lobby",
            Verb::MessagePosted,
            "ada",
            Role::Agent,
            json!({"text": "done"}),
        );
        reply.parent = Some(g.id);
        f.apply(&reply);
        let r = f.room("lobby").unwrap();
        assert_eq!(r.waiting_on_absent(&live(&["r0"]), true).len(), 1);
        assert_eq!(r.waiting_on_absent(&live(&["r0"]), false).len(), 2);
        // A broadcast names nobody: nothing is awaited.
        f.apply(&row(
            "lobby",
            Verb::MessagePosted,
            "hank",
            Role::Human,
            json!({"text": "anyone?"}),
        ));
        assert_eq!(f.room("lobby").unwrap().awaited().count(), 2);
    }
}
