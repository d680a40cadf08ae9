//! The closed set of verbs of the protocol. Every verb is documented in
//! `docs/protocol.md`; a row with any other verb is foreign and readers skip it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

macro_rules! verbs {
    ($( $(#[$doc:meta])* $name:ident => $text:literal, )*) => {
        /// A protocol verb, `namespace.action`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Verb {
            $( $(#[$doc])* $name, )*
        }

        impl Verb {
            /// Every verb, in declaration order.
            pub const ALL: &'static [Verb] = &[$(Verb::$name,)*];

            /// The wire text, e.g. `message.posted`.
            pub fn as_str(&self) -> &'static str {
                match self { $( Verb::$name => $text, )* }
            }
        }

        impl FromStr for Verb {
            type Err = ModelError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok(Verb::$name), )*
                    other => Err(ModelError::UnknownVerb(other.to_string())),
                }
            }
        }
    };
}

verbs! {
    /// A room was created; body names its owner.
    RoomCreated => "room.created",
    /// The room owner replaced the room's owner key; signed by the current key.
    RoomKeyRotated => "room.key_rotated",
    /// An agent joined a room; body carries its declared capabilities.
    AgentRegistered => "agent.registered",
    /// A message in a room or thread, from a person, an agent or huddle.
    MessagePosted => "message.posted",
    /// A relay started an agent turn.
    TurnPrompted => "turn.prompted",
    /// An agent turn ended with a reply.
    TurnReplied => "turn.replied",
    /// An agent turn failed (non-zero exit, timeout, lost claim).
    TurnFailed => "turn.failed",
    /// Presence and designation notes for the board.
    CoordNote => "coord.note",
    /// A task of the DAG; first creation of an id wins.
    TaskCreated => "task.created",
    /// An agent's bid for a task under `bid` allocation.
    TaskBid => "task.bid",
    /// An explicit rejection of a losing bid.
    TaskRejected => "task.rejected",
    /// A task was claimed (owner, epoch, attempt).
    TaskClaimed => "task.claimed",
    /// A task was completed by its current owner at its current epoch.
    TaskCompleted => "task.completed",
    /// A task attempt failed.
    TaskFailed => "task.failed",
    /// A task attempt was given back.
    TaskReleased => "task.released",
    /// The owner's `!retry`: an abandoned or cancelled task gets a fresh attempt budget.
    TaskRetried => "task.retried",
    /// The owner's `!cancel`: a task (and, when asked, its dependants) will not run.
    TaskCancelled => "task.cancelled",
    /// A reviewer's verdict on a task submitted for review (`[review @agent]`):
    /// accept (done) or reject with feedback (another attempt).
    TaskReviewed => "task.reviewed",
    /// A room or thread config change from the owner.
    ConfigSet => "config.set",
    /// A quorum decision was proposed.
    DecisionProposed => "decision.proposed",
    /// A vote on a proposed decision.
    DecisionVoted => "decision.voted",
    /// A decision was committed.
    DecisionCommitted => "decision.committed",
    /// A barrier was opened with its roster.
    BarrierOpened => "barrier.opened",
    /// A participant checked in at a barrier.
    BarrierCheckin => "barrier.checkin",
    /// A coordinator lease heartbeat, carrying its epoch.
    LeaseHeartbeat => "lease.heartbeat",
    /// A coordinator directive, fenced by the lease epoch.
    LeaseDirective => "lease.directive",
    /// A proposed decision was escalated to a person: quorum reached but the winning
    /// margin was under the threshold (or a tie).
    DecisionEscalated => "decision.escalated",
    /// A proposed decision failed: its deadline passed without a quorum, or a quorum
    /// became unreachable. Re-propose under a new id.
    DecisionFailed => "decision.failed",
    /// A barrier passed: everyone checked in, or the timeout proceeded with a quorum
    /// and the missing participants are dropped.
    BarrierPassed => "barrier.passed",
    /// A barrier timed out without proceeding and was escalated to a person.
    BarrierEscalated => "barrier.escalated",
    /// An agent asks the room owner before an action; the owner answers with a
    /// signed `!approve` / `!deny`.
    ApprovalRequested => "approval.requested",
    /// An interim progress note of a running turn; never the turn's reply.
    TurnProgress => "turn.progress",
    /// A relay's slow heartbeat in each room it serves: who it hosts, its version and
    /// how far behind the ledger it is.
    RelayHeartbeat => "relay.heartbeat",
    /// A room settled: nothing ready, claimed or running; body has the task counts.
    RoomSettled => "room.settled",
    /// The room was archived by its owner: every other row was exported and removed;
    /// the body records how many and a digest of their content, signed by the owner.
    /// Nothing can be appended to the room after it.
    RoomArchived => "room.archived",
    /// An agent took shared resources (names, modes, claim epochs, expiry).
    ResourceAcquired => "resource.acquired",
    /// An agent renewed resources it holds.
    ResourceRenewed => "resource.renewed",
    /// An agent gave resources back.
    ResourceReleased => "resource.released",
    /// A new version of a shared-state key (the version it makes, the value).
    StatePut => "state.put",
    /// Several task turns' rows of one room and writer in one fenced row (plan 0080):
    /// readers see its items, never the row itself.
    TaskLot => "task.lot",
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Verb {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Verb {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_round_trip_and_are_namespaced() {
        for v in Verb::ALL {
            assert_eq!(v.as_str().parse::<Verb>().unwrap(), *v);
            let (ns, action) = v.as_str().split_once('.').unwrap();
            assert!(!ns.is_empty() && !action.is_empty());
        }
        assert!("nope.nope".parse::<Verb>().is_err());
    }
}
