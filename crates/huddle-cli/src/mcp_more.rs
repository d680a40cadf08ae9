//! More of `huddle mcp` (plan 0021): the `task_bid` tool (a second tool router of
//! [`AgentTools`], added to the first in [`AgentTools::new`]; glue only, as in
//! [`crate::mcp`]) and `--print-config`, the snippets that register the server in
//! MCP clients.

use huddle_agent::{BidArgs, BidResult};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde_json::json;

use crate::mcp::{answer, AgentTools, Answer};

#[tool_router(router = more_router, vis = "pub(crate)")]
impl AgentTools {
    #[tool(
        name = "task_bid",
        description = "Bid on a ready task while its bid window is open (rooms with `allocation bid`): your `load` is the score, lower wins (default: the tasks you hold). `decline: true` declines instead. One answer per task attempt; the first counts. After the window closes the best bidder claims it with task_claim."
    )]
    async fn task_bid(&self, Parameters(args): Parameters<BidArgs>) -> Answer<BidResult> {
        answer(self.session.task_bid(args).await)
    }
}

/// MCP clients `huddle mcp --print-config` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    /// Claude Code: `.mcp.json` in the project (or `claude mcp add-json`).
    Claude,
    /// Codex: `~/.codex/config.toml`.
    Codex,
    /// Gemini CLI: `.gemini/settings.json` (project) or `~/.gemini/settings.json`.
    Gemini,
    /// Cursor: `.cursor/mcp.json` (project) or `~/.cursor/mcp.json`.
    Cursor,
}

impl Client {
    /// Where the snippet goes.
    pub fn file(self) -> &'static str {
        match self {
            Client::Claude => ".mcp.json (project root), merged into \"mcpServers\"",
            Client::Codex => "~/.codex/config.toml",
            Client::Gemini => {
                ".gemini/settings.json or ~/.gemini/settings.json, merged into \"mcpServers\""
            }
            Client::Cursor => ".cursor/mcp.json or ~/.cursor/mcp.json, merged into \"mcpServers\"",
        }
    }
}

/// What the printed configuration starts.
pub struct Launch<'a> {
    /// The `huddle` executable.
    pub command: String,
    /// The database, passed as `HUDDLE_DB`.
    pub db: &'a str,
    /// The room.
    pub room: &'a str,
    /// The agent.
    pub agent: &'a str,
    /// Declared capabilities.
    pub capabilities: &'a [String],
}

impl Launch<'_> {
    fn args(&self) -> Vec<String> {
        let mut args = vec![
            "mcp".to_string(),
            "--room".to_string(),
            self.room.to_string(),
            "--agent".to_string(),
            self.agent.to_string(),
        ];
        if !self.capabilities.is_empty() {
            args.push("--capabilities".to_string());
            args.push(self.capabilities.join(","));
        }
        args
    }

    /// The snippet registering this server (named `huddle`) in `client`.
    pub fn config(&self, client: Client) -> String {
        let args = self.args();
        match client {
            Client::Codex => {
                format!(
                    "[mcp_servers.huddle]\ncommand = {}\nargs = [{}]\nenv = {{ HUDDLE_DB = {} }}\n",
                    toml_str(&self.command),
                    args.iter()
                        .map(|a| toml_str(a))
                        .collect::<Vec<_>>()
                        .join(", "),
                    toml_str(self.db)
                )
            }
            Client::Claude | Client::Gemini | Client::Cursor => {
                let mut server = json!({
                    "command": self.command,
                    "args": args,
                    "env": { "HUDDLE_DB": self.db },
                });
                if client == Client::Claude {
                    server["type"] = json!("stdio");
                }
                let doc = json!({ "mcpServers": { "huddle": server } });
                format!("{:#}\n", doc)
            }
        }
    }
}

/// `huddle mcp --print-config CLIENT`: prints the snippet for `who` on `db` (and, on
/// standard error, where it goes).
pub fn print_config(
    db: &str,
    who: &crate::task_cmds::Identity,
    client: Client,
) -> anyhow::Result<()> {
    let launch = Launch {
        command: std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "huddle".to_string()),
        db: &absolute_db(db),
        room: &who.room,
        agent: &who.agent,
        capabilities: &who.capabilities,
    };
    eprintln!("# for {}", client.file());
    print!("{}", launch.config(client));
    Ok(())
}

/// `db` with a relative SQLite path made absolute: the client starts the server in a
/// directory of its own choosing.
pub fn absolute_db(db: &str) -> String {
    let (scheme, path) = if let Some(p) = db.strip_prefix("sqlite://") {
        ("sqlite://", p)
    } else if db.contains("://") {
        return db.to_string();
    } else if let Some(p) = db.strip_prefix("sqlite:") {
        ("sqlite:", p)
    } else {
        ("", db)
    };
    let p = std::path::Path::new(path);
    if p.is_absolute() || path == ":memory:" {
        return db.to_string();
    }
    let p = p.strip_prefix(".").unwrap_or(p);
    match std::env::current_dir() {
        Ok(dir) => format!("{scheme}{}", dir.join(p).display()),
        Err(_) => db.to_string(),
    }
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_escape_quotes_backslashes_and_controls() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(toml_str("x\ny"), r#""x\u000Ay""#);
    }

    #[test]
    fn relative_sqlite_paths_become_absolute_and_urls_stay() {
        let here = std::env::current_dir().unwrap();
        let abs = |p: &str| here.join(p).display().to_string();
        assert_eq!(absolute_db("./h.db"), abs("h.db"));
        assert_eq!(
            absolute_db("sqlite://d/h.db"),
            format!("sqlite://{}", abs("d/h.db"))
        );
        assert_eq!(
            absolute_db("sqlite:h.db"),
            format!("sqlite:{}", abs("h.db"))
        );
        for same in [
            "/x/h.db",
            "sqlite:///x/h.db",
            "sqlite::memory:",
            "postgres://u@h/db",
        ] {
            assert_eq!(absolute_db(same), same);
        }
    }
}
