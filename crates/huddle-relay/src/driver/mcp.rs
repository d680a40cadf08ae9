//! What a relay hands a driven agent so that it can also act for itself: the command
//! that starts `huddle mcp` for that agent in the turn's room (plan 0022). The exec
//! driver passes it in `HUDDLE_MCP` (with the database in `HUDDLE_DB`); the ACP driver
//! lists it in `session/new`'s `mcpServers`.

use std::path::PathBuf;

/// How to start huddle's MCP server for one hosted agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpLaunch {
    /// The `huddle` program (the relay's own executable).
    pub program: PathBuf,
    /// The database the server opens, passed in `HUDDLE_DB` rather than on the
    /// command line (a Postgres URL may carry a password).
    pub database: String,
    /// The agent's declared capabilities.
    pub capabilities: Vec<String>,
    /// The writer the server writes as: the relay's id (`HUDDLE_RELAY_ID`), so a
    /// driven agent's rows are its relay's (bindings and registered keys name it).
    pub writer: Option<String>,
    /// The relay's key file when it signs (`HUDDLE_RELAY_KEY`): the server signs
    /// every row with it, as its relay does.
    pub key: Option<PathBuf>,
}

impl McpLaunch {
    /// The server's arguments for `agent` in `room`.
    pub fn args(&self, room: &str, agent: &str) -> Vec<String> {
        let mut args = vec![
            "mcp".to_string(),
            "--room".to_string(),
            room.to_string(),
            "--agent".to_string(),
            agent.to_string(),
        ];
        if !self.capabilities.is_empty() {
            args.push("--capabilities".to_string());
            args.push(self.capabilities.join(","));
        }
        args
    }

    /// The environment the server needs besides its arguments: the database
    /// (`HUDDLE_DB`, kept off the command line since a Postgres URL may carry a
    /// password), the writer id (`HUDDLE_RELAY_ID`) and, when the relay signs, its
    /// key file (`HUDDLE_RELAY_KEY`).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("HUDDLE_DB", self.database.clone())];
        if let Some(w) = &self.writer {
            env.push(("HUDDLE_RELAY_ID", w.clone()));
        }
        if let Some(k) = &self.key {
            env.push(("HUDDLE_RELAY_KEY", k.display().to_string()));
        }
        env
    }

    /// The whole command line, each word quoted for `sh`: what `HUDDLE_MCP` holds.
    pub fn command_line(&self, room: &str, agent: &str) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args(room, agent))
            .map(|w| sh_quote(&w))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `word` as one `sh` word: as is when it has only safe characters, otherwise in
/// single quotes (a `'` inside written as `'\''`).
fn sh_quote(word: &str) -> String {
    let safe = |b: u8| b.is_ascii_alphanumeric() || b"-_./,:=@%+".contains(&b);
    if !word.is_empty() && word.bytes().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_one_sh_word_per_argument() {
        let launch = McpLaunch {
            program: PathBuf::from("/opt/my tools/huddle"),
            database: "postgres://u:p@h/db".into(),
            capabilities: vec!["rust".into(), "sql".into()],
            writer: Some("r0".into()),
            key: Some(PathBuf::from("/keys/r0.key")),
        };
        assert_eq!(
            launch.env(),
            [
                ("HUDDLE_DB", "postgres://u:p@h/db".to_string()),
                ("HUDDLE_RELAY_ID", "r0".to_string()),
                ("HUDDLE_RELAY_KEY", "/keys/r0.key".to_string()),
            ]
        );
        let line = launch.command_line("lobby", "o'brien");
        assert_eq!(
            line,
            r"'/opt/my tools/huddle' mcp --room lobby --agent 'o'\''brien' --capabilities rust,sql"
        );
        // sh reads it back as the same words, and the database is not among them.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("for w in {line}; do printf '%s\\n' \"$w\"; done"))
            .output()
            .expect("run sh");
        let words: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        let mut expected = vec!["/opt/my tools/huddle".to_string()];
        expected.extend(launch.args("lobby", "o'brien"));
        assert_eq!(words, expected);
        assert!(!line.contains("postgres"));
    }
}
