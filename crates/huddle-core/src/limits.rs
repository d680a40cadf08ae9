//! Size limits enforced before any write.

use serde::{Deserialize, Serialize};

/// Limits every store applies to an interaction before writing it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest canonical body, in bytes (default 256 KiB).
    pub max_body_bytes: usize,
    /// Longest room, thread, actor name or idempotency key, in bytes (default 256).
    pub max_name_bytes: usize,
    /// Most entries in `caused_by` (default 64).
    pub max_causes: usize,
    /// Most interactions in one appended batch (default 1,000).
    pub max_batch: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 256 * 1024,
            max_name_bytes: 256,
            max_causes: 64,
            max_batch: 1000,
        }
    }
}
