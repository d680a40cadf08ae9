//! End-to-end: nothing fails silently (plan 0027). Each mistake a new user makes
//! gets an error naming it and what to do, through the real binary: exit status and
//! message asserted.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::relays::*;
use common::*;
use huddle_core::{InteractionId, Role, Verb};
use serde_json::Value;

on_both_backends!(
    missing_database_room_and_room_list,
    relay_refuses_rooms_that_do_not_exist,
    non_owner_is_told_once_and_post_waits_for_answers,
);

/// Runs `c` and returns its output; panics if it is still running after `limit`
/// (a relay that should refuse to start but runs instead).
fn exits_within(mut c: Command, limit: Duration) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn huddle");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("wait")
}

fn failed(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit status 1; stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn relay(config: &Path) -> Command {
    let mut c = Command::new(huddle_bin());
    c.args(["relay", "--config"])
        .arg(config)
        .env_remove("HUDDLE_DB")
        .env_remove("HUDDLE_LOG")
        .env_remove("RUST_LOG")
        .env("HUDDLE_KEYS", keys_dir());
    c
}

/// A database URL on the same server as `url` whose database does not exist.
fn misspelled(url: &str) -> String {
    match url.rsplit_once('/') {
        Some((base, _)) if url.starts_with("postgres") => format!("{base}/hudle_no_such_db"),
        _ => {
            let file = Path::new(url.trim_start_matches("sqlite://"));
            file.with_file_name("hudle.db").display().to_string()
        }
    }
}

async fn missing_database_room_and_room_list(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    // A misspelled --db: no new empty database, an error saying so.
    let typo = misspelled(&db.url);
    let err = failed(&run({
        let mut c = huddle(&typo);
        c.args(["tail", "--room", "lobby"]);
        c
    }));
    match backend {
        Backend::Sqlite => {
            assert!(err.contains("no such database"), "{err}");
            assert!(
                err.contains(&format!("huddle --db {typo} migrate")),
                "{err}"
            );
            assert!(!Path::new(&typo).exists(), "the typo made a database");
        }
        _ => {
            assert!(err.contains("cannot open the database"), "{err}");
            assert!(err.contains("hudle_no_such_db"), "{err}");
        }
    }
    ok({
        let mut c = huddle(&db.url);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    // tail on a room that does not exist is an error, not an empty success.
    let err = failed(&run({
        let mut c = huddle(&db.url);
        c.args(["tail", "--room", "nowhere"]);
        c
    }));
    assert!(err.contains("there is no room \"nowhere\""), "{err}");
    assert!(
        err.contains("huddle room create nowhere --owner ID"),
        "{err}"
    );
    ok({
        let mut c = huddle(&db.url);
        c.args(["post", "--room", "lobby", "--as", "hank", "hello"]);
        c
    });
    let text = ok({
        let mut c = huddle(&db.url);
        c.args(["room", "list"]);
        c
    });
    assert_eq!(text.trim(), "lobby  owner olga  2 rows", "{text}");
    let json: Value = serde_json::from_str(&ok({
        let mut c = huddle(&db.url);
        c.args(["room", "list", "--json"]);
        c
    }))
    .expect("room list --json is JSON");
    assert_eq!(
        json,
        serde_json::json!([{ "room": "lobby", "owner": "olga", "rows": 2 }])
    );
}

async fn relay_refuses_rooms_that_do_not_exist(backend: Backend) {
    let h = Huddle::new(backend).await;
    let config = h.dir().join("huddle.toml");
    std::fs::write(
        &config,
        relay_toml(
            "r1",
            &h.db.url,
            &["lobby", "lobbby", "hall"],
            &[AgentSpec::sim("ada", 10)],
        ),
    )
    .expect("write huddle.toml");
    let err = failed(&exits_within(relay(&config), secs(30)));
    assert!(
        err.contains("rooms \"lobbby\", \"hall\" do not exist"),
        "{err}"
    );
    assert!(
        err.contains(
            "`huddle room create lobbby --owner ID` and `huddle room create hall --owner ID`"
        ),
        "{err}"
    );
    // Nothing was written into the misspelled rooms.
    let store = &h.store;
    for room in ["lobbby", "hall"] {
        let batch = store
            .read_room(room, huddle_core::Position::START, 10)
            .await
            .expect("read");
        assert!(batch.rows.is_empty(), "rows in {room}");
    }
}

#[test]
fn relay_refuses_an_exec_program_it_cannot_find() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("h.db").display().to_string();
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    let config = dir.path().join("huddle.toml");
    std::fs::write(
        &config,
        "relay = \"r1\"\ndatabase = \"h.db\"\nrooms = [\"lobby\"]\n\n[[agent]]\nkey = \"bob\"\n\
         driver = \"exec\"\nexec = { command = [\"no-such-agent-program\"] }\n",
    )
    .expect("write huddle.toml");
    let err = failed(&exits_within(relay(&config), secs(30)));
    assert!(
        err.contains("agent \"bob\": exec: no executable \"no-such-agent-program\""),
        "{err}"
    );
    // A database the configuration names that does not exist is not created either.
    std::fs::write(
        &config,
        "relay = \"r1\"\ndatabase = \"hh.db\"\nrooms = [\"lobby\"]\n",
    )
    .expect("write huddle.toml");
    let err = failed(&exits_within(relay(&config), secs(30)));
    assert!(err.contains("no such database"), "{err}");
    assert!(!dir.path().join("hh.db").exists());
}

/// Paths in huddle.toml are relative to its directory, wherever the relay is started;
/// the relay says what it hosts at `info` by default, without colour codes in a file.
#[test]
fn relay_start_lines_and_config_relative_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let conf_dir = dir.path().join("conf");
    std::fs::create_dir_all(conf_dir.join("bin")).expect("mkdir");
    let db = conf_dir.join("h.db").display().to_string();
    ok({
        let mut c = huddle(&db);
        c.args(["room", "create", "lobby", "--owner", "olga"]);
        c
    });
    let agent = conf_dir.join("bin/agent.sh");
    std::fs::write(&agent, "#!/bin/sh\ncat >/dev/null\necho done\n").expect("write agent");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let config = conf_dir.join("huddle.toml");
    std::fs::write(
        &config,
        "relay = \"r1\"\ndatabase = \"h.db\"\nrooms = [\"lobby\"]\n\n\
         [[agent]]\nkey = \"ada\"\ndriver = \"sim\"\n\n\
         [[agent]]\nkey = \"bob\"\ndriver = \"exec\"\n\
         exec = { command = [\"./bin/agent.sh\"], cwd = \"work\" }\n",
    )
    .expect("write huddle.toml");
    std::fs::create_dir_all(conf_dir.join("work")).expect("mkdir work");
    let log = dir.path().join("relay.log");
    let mut c = relay(&config);
    c.current_dir(elsewhere.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut child = c.spawn().expect("spawn the relay");
    let deadline = Instant::now() + secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("relay starting") {
            break text;
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the relay exited ({status}): {text}");
        }
        assert!(Instant::now() < deadline, "no start-up lines: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().expect("wait for the relay");
    assert!(status.success(), "relay exit: {status}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file: {text}"
    );
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}: {text}"))
            .to_string()
    };
    let room = line("joining room");
    assert!(
        room.contains("INFO") && room.contains("room=lobby") && room.contains("owner=olga"),
        "{room}"
    );
    assert!(line("hosting agent: sim").contains("agent=ada"), "{text}");
    // One batch in flight by default on SQLite (plan 0091).
    assert!(
        line("relay starting").contains("batches_in_flight=1"),
        "{text}"
    );
    let bob = line("hosting agent: exec");
    assert!(bob.contains("agent=bob"), "{bob}");
    assert!(
        bob.contains(&conf_dir.join("./bin/agent.sh").display().to_string()),
        "{bob}"
    );
    // The relay used the database next to its configuration, not one in its cwd.
    assert!(!elsewhere.path().join("h.db").exists());
}

/// The text of the system's reply to `command`, read from the ledger.
fn system_replies(h: &Huddle, command: InteractionId) -> Vec<String> {
    h.ledger
        .of_verb(Verb::MessagePosted)
        .map(|(_, r)| r)
        .filter(|r| r.role == Role::System && r.parent == Some(command))
        .map(|r| r.body["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn non_owner_is_told_once_and_post_waits_for_answers(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    h.spawn_relay("r1", vec![AgentSpec::sim("ada", 20)]);
    h.spawn_relay("r2", vec![AgentSpec::sim("bob", 20)]);
    h.wait_registered(&["ada", "bob"]).await;
    let post = |who: &str, wait: &str, text: &str| {
        let mut c = huddle(&h.db.url);
        c.args(["post", "--room", "lobby", "--as", who, wait, text]);
        c
    };
    // The owner sees a command's answer without tailing.
    let out = ok(post("olga", "--wait", "!config get claim-ttl"));
    let mut lines = out.lines();
    let id = lines.next().unwrap_or_default();
    assert_eq!(id.len(), 64, "the id comes first: {out}");
    let answer: Vec<&str> = lines.collect();
    assert!(answer[0].starts_with("huddle (system): "), "{out}");
    assert!(out.contains("claim-ttl = 1m (default)"), "{out}");
    // Every error of one !config is reported, in one answer.
    let out = ok(post("olga", "--wait=30", "!config rat 5 claim-ttl 30"));
    assert!(out.contains("2 errors:"), "{out}");
    assert!(out.contains("unknown config key `rat`"), "{out}");
    assert!(out.contains("bad value `30` for `claim-ttl`"), "{out}");

    // A person who is not the owner is told who may command, once.
    let out = ok(post("hank", "--wait=30", "!config rate 5"));
    assert!(
        out.contains("!config was not run: only the room's owner, olga, may command room lobby"),
        "{out}"
    );
    let first: InteractionId = out.lines().next().unwrap_or_default().parse().expect("id");
    // Within the window the next command gets no answer: --wait times out, exit 1.
    let timed_out = run(post("hank", "--wait=2", "!delegate\na: anything"));
    let err = failed(&timed_out);
    let second: InteractionId = String::from_utf8_lossy(&timed_out.stdout)
        .trim()
        .parse()
        .expect("the id is printed before waiting");
    assert!(
        err.contains(&format!("no reply to {} within 2 s", second.short())),
        "{err}"
    );
    // Both relays wrote the reply; the ledger holds it once. The second command was
    // not executed and not answered.
    h.wait_until("the reply to hank", secs(30), |l| {
        l.system_reply(first).is_some()
    })
    .await;
    assert_eq!(system_replies(&h, first).len(), 1);
    assert!(system_replies(&h, second).is_empty());
    assert!(h.ledger.task("a").is_none());
    let wrong = run({
        let mut c = huddle(&h.db.url);
        c.args(["post", "--room", "lobby", "--as", "hank", "--wait=0", "hi"]);
        c
    });
    assert!(failed(&wrong).contains("--wait=0: give a positive number of seconds"));
    h.stop_all().await;
}
