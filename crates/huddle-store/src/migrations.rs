//! Schema migrations, embedded from `migrations/{postgres,sqlite}/NNNN_*.sql`.
//!
//! Each backend applies the pending ones in order, recording `(version, name,
//! checksum)` in `huddle_migration`. An applied migration whose text changed, or a
//! database with a version this build does not know, is refused with a clear error.
//! On Postgres the whole run holds `pg_advisory_lock(MIGRATION_LOCK)`, so relays
//! starting together are safe.

/// One migration.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// Version number, from the file name.
    pub version: i64,
    /// Name, from the file name.
    pub name: &'static str,
    /// SQL text.
    pub sql: &'static str,
}

impl Migration {
    /// A stable checksum of the SQL text (hex FNV-1a 64; enough to notice an edit).
    pub fn checksum(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.sql.as_bytes() {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// Advisory lock id taken around Postgres migrations ("huddle" in ASCII).
pub const MIGRATION_LOCK: i64 = 0x6875_6464_6c65;

/// The migrations of one backend's folder, in order: `version name file`.
macro_rules! migrations {
    ($dir:literal: $($version:literal $name:literal $file:literal),* $(,)?) => {
        &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../migrations/", $dir, "/", $file)),
        }),*]
    };
}

/// Postgres migrations, in order.
pub const POSTGRES: &[Migration] = migrations!("postgres":
    1 "ledger" "0001_ledger.sql",
    2 "claim_close" "0002_claim_close.sql",
    3 "trust" "0003_trust.sql",
    4 "directed_replies" "0004_directed_replies.sql",
    5 "agent_token" "0005_agent_token.sql",
    6 "signed_rows" "0006_signed_rows.sql",
    7 "resources" "0007_resources.sql",
    8 "handoff" "0008_handoff.sql",
    9 "task_generations" "0009_task_generations.sql",
    10 "review_gates" "0010_review_gates.sql",
    11 "handoff_rows" "0011_handoff_rows.sql",
    12 "archived_rooms" "0012_archived_rooms.sql",
    13 "batch_acquire_inline" "0013_batch_acquire_inline.sql",
    14 "task_lots" "0014_task_lots.sql",
    15 "claim_keys_bytewise" "0015_claim_keys_bytewise.sql",
    16 "acquire_without_waiting_on_held" "0016_acquire_without_waiting_on_held.sql",
    17 "command_result_claims" "0017_command_result_claims.sql",
    18 "claim_drivers" "0018_claim_drivers.sql",
);

/// SQLite migrations, in order.
pub const SQLITE: &[Migration] = migrations!("sqlite":
    1 "ledger" "0001_ledger.sql",
    2 "claim_close" "0002_claim_close.sql",
    3 "trust" "0003_trust.sql",
    4 "directed_replies" "0004_directed_replies.sql",
    5 "agent_token" "0005_agent_token.sql",
    6 "signed_rows" "0006_signed_rows.sql",
    7 "resources" "0007_resources.sql",
    8 "task_generations" "0008_task_generations.sql",
    9 "review_gates" "0009_review_gates.sql",
    10 "archived_rooms" "0010_archived_rooms.sql",
    11 "task_lots" "0011_task_lots.sql",
    12 "claim_drivers" "0012_claim_drivers.sql",
);

/// Checks that the applied migrations are a prefix of `known` with equal checksums,
/// and returns the ones still to apply.
pub fn pending<'a>(
    known: &'a [Migration],
    applied: &[(i64, String)],
) -> Result<&'a [Migration], String> {
    for (i, (version, checksum)) in applied.iter().enumerate() {
        let Some(m) = known.get(i) else {
            return Err(format!(
                "the database has migration {version}, which this build of huddle does not know; upgrade huddle"
            ));
        };
        if m.version != *version {
            return Err(format!(
                "applied migration {version} does not match expected migration {}",
                m.version
            ));
        }
        if &m.checksum() != checksum {
            return Err(format!(
                "migration {version} ({}) was changed after it was applied",
                m.name
            ));
        }
    }
    Ok(&known[applied.len().min(known.len())..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_checks_prefix_and_checksums() {
        let all = POSTGRES;
        assert_eq!(pending(all, &[]).unwrap().len(), all.len());
        let applied = vec![(1, all[0].checksum())];
        assert_eq!(pending(all, &applied).unwrap().len(), all.len() - 1);
        assert!(pending(all, &[(1, "x".into())]).is_err());
        assert!(pending(all, &[(1, all[0].checksum()), (99, "y".into())]).is_err());
    }
}
