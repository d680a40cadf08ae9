//! huddle: a coordination layer for groups of AI agents that share a room.
//!
//! This facade re-exports the library crates. The `huddle` binary lives in
//! `crates/huddle-cli`; the end-to-end tests of this package run it.
pub use huddle_core as core;
pub use huddle_relay as relay;
pub use huddle_store as store;
