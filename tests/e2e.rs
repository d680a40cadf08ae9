//! The end-to-end tests of the `huddle` package: the real binary, several relays as
//! separate processes, on SQLite and Postgres. One test binary for all of them (one
//! link instead of one per file); each file is a module, run one with
//! `cargo test -p huddle --test e2e fault_battery::`.

#[macro_use]
mod common;

mod acp_relays;
mod admin_setup;
mod agent_binding;
mod agent_lifetime;
mod archive_rooms;
mod assignees;
mod bench_cmds;
mod board_tasks;
mod cli_errors;
mod cli_postgres;
mod cli_sqlite;
mod conversation;
mod dashboard;
mod dashboard_browser;
mod dashboard_owner;
mod demo;
mod exactly_once;
mod fault_battery;
mod mcp;
mod mcp_config;
mod mcp_driven;
mod mcp_gates;
mod mcp_http;
mod operator_cli;
mod owner_signatures;
mod pacing;
mod pattern_cli;
mod presence;
mod relay_e2e;
mod relay_metrics;
mod resources;
mod review;
mod sagas;
mod signed_writers;
mod task_annotations;
mod task_cli;
mod task_lifecycle;
mod task_uses;
mod team;
