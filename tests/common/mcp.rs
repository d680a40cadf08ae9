//! The official MCP Python SDK for the end-to-end tests' MCP clients: installed into
//! `target/mcp-venv` on first use (or taken from `HUDDLE_MCP_PYTHON`); failing to
//! install it fails the test loudly.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{huddle_bin, keys_dir};
use std::sync::OnceLock;

/// The directory of the client scripts (`tests/mcp`).
pub fn mcp_scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// The Python with the MCP SDK.
pub fn mcp_python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Ok(p) = std::env::var("HUDDLE_MCP_PYTHON") {
            return PathBuf::from(p);
        }
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-venv");
        let py = venv.join("bin/python");
        let has_sdk = |py: &Path| {
            Command::new(py)
                .args(["-c", "import mcp.client.stdio"])
                .status()
                .is_ok_and(|s| s.success())
        };
        if !has_sdk(&py) {
            let made = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .is_ok_and(|s| s.success());
            assert!(made, "cannot create a Python venv at {}: install python3-venv", venv.display());
            let installed = Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "mcp"])
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                installed && has_sdk(&py),
                "cannot install the MCP Python SDK (`pip install mcp`) into {}; install it there or set HUDDLE_MCP_PYTHON",
                venv.display()
            );
        }
        py
    })
    .clone()
}

/// The client script `name` of `tests/mcp`, run with the SDK's Python and the
/// environment the scripts read: `HUDDLE_BIN`, `HUDDLE_DB`, `HUDDLE_ROOM`, and the
/// tests' owner keys (`HUDDLE_KEYS`, for `huddle post --as OWNER`).
pub fn client_script(name: &str, db: &str, room: &str) -> Command {
    let dir = mcp_scripts();
    let mut c = Command::new(mcp_python());
    c.arg(dir.join(name))
        .env("PYTHONPATH", &dir)
        .env("HUDDLE_BIN", huddle_bin())
        .env("HUDDLE_DB", db)
        .env("HUDDLE_ROOM", room)
        .env("HUDDLE_KEYS", keys_dir())
        .env_remove("HUDDLE_OWNER_KEY")
        .env("HUDDLE_LOG", "warn")
        .env_remove("RUST_LOG");
    c
}

/// An exec agent script in `h`'s directory that runs `tests/mcp/driven.py`: it acts
/// through the `huddle mcp` its relay hands it and replies `mine=<its tasks>`.
pub fn driven_agent_script(h: &super::relays::Huddle) -> PathBuf {
    h.script(
        "driven.sh",
        &format!(
            "PYTHONPATH='{dir}' exec '{py}' '{dir}/driven.py'\n",
            dir = mcp_scripts().display(),
            py = mcp_python().display()
        ),
    )
}
