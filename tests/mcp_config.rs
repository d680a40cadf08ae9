//! End-to-end: `huddle mcp --print-config CLIENT` prints a snippet that parses (JSON or
//! TOML) and starts this very server for the given room, agent and database.

use crate::common;

use common::*;
use serde_json::{json, Value};

/// The server's command line for room lobby, agent bo with two capabilities.
const ARGS: [&str; 7] = [
    "mcp",
    "--room",
    "lobby",
    "--agent",
    "bo",
    "--capabilities",
    "rust,sql",
];

fn print_config(client: &str) -> String {
    let mut c = huddle("sqlite:///srv/huddle.db");
    c.args(ARGS).args(["--print-config", client]);
    ok(c)
}

#[test]
fn every_client_snippet_parses_and_names_the_command_line() {
    let bin = huddle_bin().display().to_string();
    for client in ["claude", "gemini", "cursor"] {
        let out = print_config(client);
        let doc: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{client}: not JSON ({e}): {out}"));
        let server = &doc["mcpServers"]["huddle"];
        assert_eq!(server["command"], json!(bin), "{client}: {out}");
        assert_eq!(server["args"], json!(ARGS), "{client}: {out}");
        assert_eq!(
            server["env"]["HUDDLE_DB"], "sqlite:///srv/huddle.db",
            "{client}"
        );
    }
    let out = print_config("codex");
    let doc: toml::Table = out
        .parse()
        .unwrap_or_else(|e| panic!("codex: not TOML ({e}): {out}"));
    let server = &doc["mcp_servers"]["huddle"];
    assert_eq!(server["command"].as_str(), Some(bin.as_str()), "{out}");
    let args: Vec<&str> = server["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(args, ARGS);
    assert_eq!(
        server["env"]["HUDDLE_DB"].as_str(),
        Some("sqlite:///srv/huddle.db")
    );

    let mut bad = huddle("x.db");
    bad.args([
        "mcp",
        "--room",
        "lobby",
        "--agent",
        "bo",
        "--print-config",
        "vim",
    ]);
    let err = fails(bad);
    assert!(err.contains("claude") && err.contains("codex"), "{err}");
}
