//! Room archives (plan 0057): the rows of a settled room, exported by its owner before
//! they are removed from the ledger, and the `room.archived` row that replaces them.
//!
//! An archive is the room's rows in ledger order followed by its `room.archived` row,
//! whose body records how many rows there are and their [`ArchiveDigest`] (blake3 over
//! their content ids in order), signed by the owner's key. [`ArchiveCheck`] verifies
//! one: every row's id is the hash of its content (within the writers' limits), rows
//! are of the room and in increasing ledger order, the count and digest match, and the
//! signature verifies against the room's owner key as the archived rows themselves
//! give it (their first `room.created`, then each valid `room.key_rotated`). Pure: the
//! caller reads the file.

use crate::commands::OwnerAuthority;
use crate::fold::Fold;
use crate::limits::Limits;
use crate::model::{Interaction, NewInteraction, Position, Role};
use crate::protocol::{ArchiveDigest, RoomArchivedBody};
use crate::signing;
use crate::verbs::Verb;
use crate::InteractionId;

/// Why an archive does not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveError {
    /// A row's id is not the hash of its content, or the row breaks the writers'
    /// limits.
    #[error("row {index}: {reason}")]
    BadRow {
        /// 1-based row number in the archive.
        index: u64,
        /// Why.
        reason: String,
    },
    /// A row of another room.
    #[error("row {index} is of room {found:?}, not {room:?}")]
    OtherRoom {
        /// 1-based row number.
        index: u64,
        /// The archive's room.
        room: String,
        /// The row's.
        found: String,
    },
    /// Rows out of ledger order.
    #[error("row {index} is not after the row before it in ledger order")]
    OutOfOrder {
        /// 1-based row number.
        index: u64,
    },
    /// The last row is not a valid `room.archived` row of the room.
    #[error("the last row is not the room's room.archived row: {0}")]
    NotArchived(String),
    /// The count or digest the `room.archived` row records is not the rows'.
    #[error("the room.archived row records {recorded_rows} rows with digest {recorded_digest}, the archive holds {rows} with digest {digest}")]
    Mismatch {
        /// Recorded count.
        recorded_rows: u64,
        /// Recorded digest.
        recorded_digest: String,
        /// Count of the rows.
        rows: u64,
        /// Digest of the rows.
        digest: String,
    },
    /// The owner's signature does not verify.
    #[error("the room.archived row is not signed by the room's owner key: {0}")]
    BadSignature(String),
}

/// What a verified archive holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// The room.
    pub room: String,
    /// Its owner, who archived it.
    pub owner: String,
    /// How many rows were archived.
    pub rows: u64,
    /// Their digest.
    pub digest: String,
    /// The id of the `room.archived` row.
    pub archived: InteractionId,
}

/// The unsigned `room.archived` row for `ids` (the room's rows in ledger order),
/// archived by `owner`: sign it with the owner's key
/// ([`crate::signing::OwnerSecret::sign`]).
pub fn archived_row<'a>(
    room: &str,
    owner: &str,
    ids: impl IntoIterator<Item = &'a InteractionId>,
) -> NewInteraction {
    let mut digest = ArchiveDigest::new();
    for id in ids {
        digest.add(id);
    }
    let body = RoomArchivedBody {
        owner: owner.to_string(),
        rows: digest.rows(),
        digest: digest.hex(),
    };
    NewInteraction::new(room, Verb::RoomArchived, owner, Role::Owner, body.to_body())
}

/// Checks an archive row by row ([`ArchiveCheck::row`]), then its `room.archived`
/// row ([`ArchiveCheck::finish`]).
pub struct ArchiveCheck {
    room: String,
    limits: Limits,
    digest: ArchiveDigest,
    authority: OwnerAuthority,
    last: Option<Position>,
}

impl ArchiveCheck {
    /// A check of an archive of `room`.
    pub fn new(room: &str) -> Self {
        ArchiveCheck {
            room: room.to_string(),
            limits: Limits::default(),
            digest: ArchiveDigest::new(),
            authority: OwnerAuthority::new(),
            last: None,
        }
    }

    /// Checks the next row: of the room, after the previous one, its id the hash of
    /// its content within the writers' limits.
    pub fn row(&mut self, row: &Interaction) -> Result<(), ArchiveError> {
        let index = self.digest.rows() + 1;
        if row.room != self.room {
            return Err(ArchiveError::OtherRoom {
                index,
                room: self.room.clone(),
                found: row.room.clone(),
            });
        }
        if self.last.is_some_and(|p| row.position <= p) {
            return Err(ArchiveError::OutOfOrder { index });
        }
        if row.verb == Verb::RoomArchived {
            return Err(ArchiveError::BadRow {
                index,
                reason: "a room.archived row among the archived rows".into(),
            });
        }
        let (id, _) = row
            .content()
            .checked(&self.limits)
            .map_err(|e| ArchiveError::BadRow {
                index,
                reason: e.to_string(),
            })?;
        if id != row.id {
            return Err(ArchiveError::BadRow {
                index,
                reason: format!(
                    "its id {} is not the hash of its content ({})",
                    row.id.short(),
                    id.short()
                ),
            });
        }
        self.last = Some(row.position);
        self.digest.add(&row.id);
        self.authority.apply(row);
        Ok(())
    }

    /// Checks the `room.archived` row that ends the archive: of the room, by its
    /// owner, recording the rows' count and digest, signed by the room's owner key.
    pub fn finish(self, archived: &NewInteraction) -> Result<ArchiveSummary, ArchiveError> {
        let not = |why: &str| ArchiveError::NotArchived(why.to_string());
        if archived.verb != Verb::RoomArchived || archived.room != self.room {
            return Err(not("another verb or room"));
        }
        let body: RoomArchivedBody = serde_json::from_value(archived.body.clone())
            .map_err(|e| ArchiveError::NotArchived(format!("its body: {e}")))?;
        let config = self.authority.config();
        let owner = config
            .owner(&self.room)
            .ok_or_else(|| not("the archived rows hold no room.created"))?;
        if archived.actor != owner || body.owner != owner || archived.role != Role::Owner {
            return Err(ArchiveError::NotArchived(format!(
                "it is by {}, the room's owner is {owner}",
                archived.actor
            )));
        }
        let digest = self.digest.hex();
        if body.rows != self.digest.rows() || body.digest != digest {
            return Err(ArchiveError::Mismatch {
                recorded_rows: body.rows,
                recorded_digest: body.digest,
                rows: self.digest.rows(),
                digest,
            });
        }
        let key = config
            .owner_key(&self.room)
            .ok_or_else(|| ArchiveError::BadSignature("the room has no owner key".into()))?;
        signing::verify(archived, &key).map_err(|e| ArchiveError::BadSignature(e.to_string()))?;
        Ok(ArchiveSummary {
            room: self.room,
            owner: owner.to_string(),
            rows: body.rows,
            digest,
            archived: archived.id(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Timestamp;
    use crate::signing::OwnerSecret;
    use serde_json::json;

    fn rows(owner: &OwnerSecret) -> Vec<Interaction> {
        let created = NewInteraction::new(
            "lobby",
            Verb::RoomCreated,
            "olga",
            Role::Owner,
            json!({"owner": "olga", "key": owner.public().to_hex()}),
        );
        let hello = NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "ana",
            Role::Human,
            json!({"text": "hello", "n": 1.5}),
        );
        [created, hello]
            .into_iter()
            .enumerate()
            .map(|(i, c)| stored(c, i as u64 + 1))
            .collect()
    }

    /// `content` as read back at position `(0, seq)`.
    fn stored(content: NewInteraction, seq: u64) -> Interaction {
        let id = content.id();
        Interaction::as_read(
            content,
            id,
            Position::new(0, seq),
            Timestamp(1),
            "cli",
            None,
        )
    }

    fn check(
        rows: &[Interaction],
        archived: &NewInteraction,
    ) -> Result<ArchiveSummary, ArchiveError> {
        let mut c = ArchiveCheck::new("lobby");
        for r in rows {
            c.row(r)?;
        }
        c.finish(archived)
    }

    #[test]
    fn an_archive_verifies_and_any_change_is_caught() {
        let owner = OwnerSecret::from_seed([5; 32]);
        let rows = rows(&owner);
        let ids: Vec<InteractionId> = rows.iter().map(|r| r.id).collect();
        let archived = owner.sign(archived_row("lobby", "olga", &ids));
        let ok = check(&rows, &archived).expect("verifies");
        assert_eq!((ok.rows, ok.owner.as_str()), (2, "olga"));

        // A changed body no longer hashes to its id.
        let mut changed = rows.clone();
        changed[1].body["text"] = json!("goodbye");
        assert!(matches!(
            check(&changed, &archived),
            Err(ArchiveError::BadRow { index: 2, .. })
        ));
        // A row left out: count and digest differ.
        assert!(matches!(
            check(&rows[..1], &archived),
            Err(ArchiveError::Mismatch { .. })
        ));
        // Out of order.
        let swapped = vec![rows[1].clone(), rows[0].clone()];
        assert!(matches!(
            check(&swapped, &archived),
            Err(ArchiveError::OutOfOrder { index: 2 })
        ));
        // Signed by another key, or not signed.
        let other = OwnerSecret::from_seed([6; 32]);
        assert!(matches!(
            check(&rows, &other.sign(archived_row("lobby", "olga", &ids))),
            Err(ArchiveError::BadSignature(_))
        ));
        assert!(matches!(
            check(&rows, &archived_row("lobby", "olga", &ids)),
            Err(ArchiveError::BadSignature(_))
        ));
        // By someone else than the owner.
        assert!(matches!(
            check(&rows, &owner.sign(archived_row("lobby", "mallory", &ids))),
            Err(ArchiveError::NotArchived(_))
        ));
        // A row of another room.
        let mut stray = rows.clone();
        stray[1].room = "elsewhere".into();
        assert!(matches!(
            check(&stray, &archived),
            Err(ArchiveError::OtherRoom { .. })
        ));
    }

    #[test]
    fn an_archive_survives_its_json_lines() {
        let owner = OwnerSecret::from_seed([5; 32]);
        let rows = rows(&owner);
        let ids: Vec<InteractionId> = rows.iter().map(|r| r.id).collect();
        let archived = owner.sign(archived_row("lobby", "olga", &ids));
        let read: Vec<Interaction> = rows
            .iter()
            .map(|r| serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap())
            .collect();
        let archived_read: NewInteraction =
            serde_json::from_str(&serde_json::to_string(&archived).unwrap()).unwrap();
        assert!(check(&read, &archived_read).is_ok());
    }
}
