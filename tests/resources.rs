//! End-to-end: shared resources and versioned shared state through the real `huddle`
//! binary, many processes at once, on SQLite and Postgres (plans 0042, 0043).
//!
//! Holders prove what they held with a side-effect log: each holder's command (run
//! by `huddle resource take ... -- COMMAND` while the resources are held) appends a
//! `begin` line when it starts and an `end` line before it exits; one `write` of a
//! short line with `O_APPEND` is atomic, so the log is one order of all the holders'
//! steps, and replaying it checks the conflict rule at every moment.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::relays::{Backend, TestDatabase};
use common::{fails, huddle, ok, run};
use huddle_core::resources::{Mode, ResourceName};

on_both_backends!(
    sixteen_processes_contend_for_overlapping_globs_shared_and_permits,
    resource_sets_taken_in_random_orders_finish_without_deadlock,
    a_killed_holders_lease_lapses_after_its_ttl,
    the_pre_commit_guard_refuses_and_allows_as_documented,
    eight_writers_read_modify_write_without_losing_an_update,
    a_terminated_mcp_server_gives_its_holdings_back,
);

const ROOM: &str = "shared";

async fn database(backend: Backend) -> TestDatabase {
    let db = TestDatabase::new(backend).await;
    ok({
        let mut c = huddle(&db.url);
        c.args(["room", "create", ROOM, "--owner", "ana"]);
        c
    });
    db
}

/// One holder's plan: what it takes, how, and the shell line that runs while it holds.
struct Holder {
    agent: String,
    args: Vec<String>,
    name: String,
    mode: Mode,
}

/// A `huddle resource take` that runs `hold` while holding, as `agent`.
fn take_cmd(db: &str, agent: &str, args: &[String], log: &Path, hold: &str) -> Command {
    let mut c = huddle(db);
    c.args(["resource", "take", "--room", ROOM, "--agent", agent]);
    c.args(["--wait-ms", "120000", "--ttl-ms", "20000"]);
    c.args(args);
    c.args(["--", "sh", "-c", hold]);
    c.env("LOG", log);
    c
}

/// Replays the log: at every `begin`, the holdings active then must admit the new
/// one by the rule of `huddle_core::resources`. Returns the most holders of each
/// resource seen at once.
fn replay(log: &str, plans: &BTreeMap<String, (ResourceName, Mode)>) -> BTreeMap<String, usize> {
    let mut active: BTreeMap<String, (ResourceName, Mode)> = BTreeMap::new();
    let mut peak: BTreeMap<String, usize> = BTreeMap::new();
    for line in log.lines() {
        let mut words = line.split_whitespace();
        let (step, agent) = (words.next().unwrap(), words.next().unwrap().to_string());
        match step {
            "begin" => {
                let (name, mode) = plans[&agent].clone();
                let touching: Vec<&(ResourceName, Mode)> =
                    active.values().filter(|(n, _)| n.touches(&name)).collect();
                let admitted = match mode {
                    Mode::Exclusive => touching.is_empty(),
                    Mode::Shared => touching.iter().all(|(_, m)| *m == Mode::Shared),
                    Mode::Permits(n) => {
                        touching.iter().all(|(_, m)| matches!(m, Mode::Permits(_)))
                            && touching.len() < n as usize
                    }
                };
                assert!(
                    admitted,
                    "{agent} began holding {name} ({mode}) beside {touching:?}\nlog:\n{log}"
                );
                assert!(active.insert(agent, (name.clone(), mode)).is_none());
                let same = active.values().filter(|(n, _)| *n == name).count();
                let p = peak.entry(name.to_string()).or_default();
                *p = (*p).max(same);
            }
            "end" => {
                assert!(
                    active.remove(&agent).is_some(),
                    "{agent} ended what it never began"
                );
            }
            other => panic!("bad log line {other:?}"),
        }
    }
    assert!(active.is_empty(), "holders that never ended: {active:?}");
    peak
}

async fn sixteen_processes_contend_for_overlapping_globs_shared_and_permits(backend: Backend) {
    let db = database(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("holders.log");
    // Overlapping globs taken exclusively (src/** meets all three; src/*.rs meets
    // **/main.rs at src/main.rs; **/main.rs and src/lib.rs share no path), readers
    // and one writer of docs, and a build slot with three permits.
    let spec: [(&str, &str); 16] = [
        ("file:src/**", "x"),
        ("file:src/*.rs", "x"),
        ("file:**/main.rs", "x"),
        ("file:src/lib.rs", "x"),
        ("file:docs/**", "s"),
        ("file:docs/**", "s"),
        ("file:docs/**", "s"),
        ("file:docs/guide/*.md", "s"),
        ("file:docs/guide/intro.md", "x"),
        ("slot:build", "p"),
        ("slot:build", "p"),
        ("slot:build", "p"),
        ("slot:build", "p"),
        ("slot:build", "p"),
        ("slot:build", "p"),
        ("file:src/**/*.rs", "x"),
    ];
    let holders: Vec<Holder> = spec
        .iter()
        .enumerate()
        .map(|(i, (name, m))| {
            let (args, mode) = match *m {
                "x" => (vec![name.to_string()], Mode::Exclusive),
                "s" => (vec!["--shared".into(), name.to_string()], Mode::Shared),
                _ => (
                    vec![
                        "--permit".into(),
                        name.to_string(),
                        "--permits".into(),
                        "3".into(),
                    ],
                    Mode::Permits(3),
                ),
            };
            Holder {
                agent: format!("a{i:02}"),
                args,
                name: ResourceName::parse(name).unwrap().to_string(),
                mode,
            }
        })
        .collect();
    let plans: BTreeMap<String, (ResourceName, Mode)> = holders
        .iter()
        .map(|h| {
            (
                h.agent.clone(),
                (ResourceName::parse(&h.name).unwrap(), h.mode),
            )
        })
        .collect();
    // 16 processes at once, each taking its resources twice in a row.
    let hold = |agent: &str| {
        format!("echo begin {agent} >> \"$LOG\"; sleep 0.25; echo end {agent} >> \"$LOG\"")
    };
    let children: Vec<(String, std::process::Child)> = holders
        .iter()
        .map(|h| {
            let mut c = Command::new("sh");
            let one = take_cmd(&db.url, &h.agent, &h.args, &log, &hold(&h.agent));
            let line = shell_line(&one);
            c.args(["-c", &format!("{line} && {line}")]);
            copy_env(&one, &mut c);
            (
                h.agent.clone(),
                c.stderr(Stdio::piped()).spawn().expect("spawn a holder"),
            )
        })
        .collect();
    for (agent, child) in children {
        let out = child.wait_with_output().expect("wait for a holder");
        assert!(
            out.status.success(),
            "{agent} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.lines().count(),
        16 * 2 * 2,
        "every holder ran twice:\n{text}"
    );
    let peak = replay(&text, &plans);
    // The rule must not serialize what it admits together: readers of docs and
    // permit holders of the slot overlapped.
    assert!(
        peak["file:docs/**"] >= 2,
        "shared holders never overlapped: {peak:?}"
    );
    assert!(
        peak["slot:build"] >= 2,
        "permit holders never overlapped: {peak:?}"
    );
    assert!(peak["slot:build"] <= 3, "{peak:?}");
    // Every acquisition and release is a ledger row.
    let tail = ok({
        let mut c = huddle(&db.url);
        c.args(["tail", "--room", ROOM, "--json"]);
        c
    });
    let verbs = |v: &str| {
        tail.lines()
            .filter(|l| l.contains(&format!("\"verb\":\"{v}\"")))
            .count()
    };
    assert_eq!(verbs("resource.acquired"), 32, "one row per acquisition");
    assert_eq!(verbs("resource.released"), 32, "one row per release");
}

/// Gives `to` the environment changes of `from`.
fn copy_env(from: &Command, to: &mut Command) {
    for (k, v) in from.get_envs() {
        match v {
            Some(v) => to.env(k, v),
            None => to.env_remove(k),
        };
    }
}

/// The shell text of a command (program and arguments, each quoted).
fn shell_line(c: &Command) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut parts = vec![quote(&c.get_program().to_string_lossy())];
    parts.extend(c.get_args().map(|a| quote(&a.to_string_lossy())));
    parts.join(" ")
}

async fn resource_sets_taken_in_random_orders_finish_without_deadlock(backend: Backend) {
    let db = database(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sets.log");
    // 12 agents, each three rounds of three of six resources, named in an order of
    // its own: taken one by one in those orders, such sets deadlock; taken as one
    // all-or-nothing step they cannot.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut scripts = Vec::new();
    for i in 0..12 {
        let agent = format!("m{i:02}");
        let mut lines = Vec::new();
        for _ in 0..3 {
            let mut pool: Vec<String> = (0..6).map(|r| format!("api:r{r}")).collect();
            let mut set = Vec::new();
            for _ in 0..3 {
                set.push(pool.remove(next(pool.len() as u64) as usize));
            }
            let hold = format!(
                "echo begin {agent} {} >> \"$LOG\"; sleep 0.05; echo end {agent} {} >> \"$LOG\"",
                set.join(","),
                set.join(",")
            );
            lines.push(shell_line(&take_cmd(&db.url, &agent, &set, &log, &hold)));
        }
        scripts.push((agent, lines.join(" && ")));
    }
    let started = Instant::now();
    let children: Vec<_> = scripts
        .iter()
        .map(|(agent, script)| {
            let mut c = Command::new("sh");
            c.args(["-c", script]).env("LOG", &log);
            copy_env(&huddle(&db.url), &mut c);
            (
                agent.clone(),
                c.stderr(Stdio::piped()).spawn().expect("spawn"),
            )
        })
        .collect();
    for (agent, child) in children {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{agent} did not get its sets: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // No resource had two holders at once.
    let text = std::fs::read_to_string(&log).unwrap();
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        for r in w[2].split(',') {
            if w[0] == "begin" {
                if let Some(other) = held.insert(r.to_string(), w[1].to_string()) {
                    panic!("{} took {r} while {other} held it\n{text}", w[1]);
                }
            } else {
                held.remove(r);
            }
        }
    }
    assert_eq!(text.lines().count(), 12 * 3 * 2);
    assert!(held.is_empty());
    eprintln!("36 sets in {:?}", started.elapsed());
}

async fn a_killed_holders_lease_lapses_after_its_ttl(backend: Backend) {
    use std::os::unix::process::CommandExt as _;
    let db = database(backend).await;
    let mut holder = huddle(&db.url);
    holder.args([
        "resource",
        "take",
        "--room",
        ROOM,
        "--agent",
        "ada",
        "api:deploy",
    ]);
    holder.args(["--ttl-ms", "2000", "--", "sleep", "60"]);
    // Its own process group, so the test can kill it and its command together.
    holder.process_group(0);
    let mut child = holder.spawn().expect("spawn the holder");
    let list = || -> Vec<serde_json::Value> {
        let out = ok({
            let mut c = huddle(&db.url);
            c.args(["resource", "list", "--room", ROOM, "--json"]);
            c
        });
        serde_json::from_str(&out).expect("json")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let held = loop {
        let l = list();
        if !l.is_empty() {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "the holder never took api:deploy"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(held[0]["holder"], "ada");
    // Killed: nothing renews or releases its holding any more.
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let _ = child.wait();
    let take_bo = |wait: &str| {
        let mut c = huddle(&db.url);
        c.args([
            "resource",
            "take",
            "--room",
            ROOM,
            "--agent",
            "bo",
            "api:deploy",
        ]);
        c.args(["--ttl-ms", "5000", "--wait-ms", wait, "--json"]);
        c
    };
    // Its last renewal keeps it for a while yet: refused at once, naming ada.
    let refused = fails(take_bo("0"));
    assert!(refused.contains("held by ada"), "{refused}");
    let out = ok(take_bo("20000"));
    let got: serde_json::Value = serde_json::from_str(&out).expect("json");
    let bo = &got["resources"][0];
    assert_eq!(bo["holder"], "bo");
    // bo took it no earlier than ada's lease ran out, by the database clock (renewals
    // only move an expiry forward, so the first one listed is a lower bound).
    let ada_expired = held[0]["expires_at"].as_i64().unwrap();
    let bo_took = bo["expires_at"].as_i64().unwrap() - 5_000_000;
    assert!(
        bo_took >= ada_expired,
        "bo took it at {bo_took}, before ada's lease ended at {ada_expired}"
    );
}

fn git(repo: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("git");
    c.args(args)
        .current_dir(repo)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .env_remove("HUDDLE_GUARD")
        .env_remove("HUDDLE_AGENT")
        .env_remove("HUDDLE_DB");
    c
}

fn git_ok(repo: &Path, args: &[&str]) {
    let out = run(git(repo, args));
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn the_pre_commit_guard_refuses_and_allows_as_documented(backend: Backend) {
    let db = database(backend).await;
    let repo = tempfile::tempdir().unwrap();
    let repo = repo.path();
    git_ok(repo, &["init", "-q"]);
    // A hook of someone else's is not replaced without --force.
    std::fs::create_dir_all(repo.join(".git/hooks")).unwrap();
    std::fs::write(repo.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    let install = |force: bool| {
        let mut c = huddle(&db.url);
        c.args(["guard", "install", "--room", ROOM, "--repo"])
            .arg(repo);
        if force {
            c.arg("--force");
        }
        c
    };
    assert!(fails(install(false)).contains("--force"));
    ok(install(true));
    ok(install(false)); // its own hook is replaced quietly
    for f in ["src/a.rs", "docs/x.md"] {
        std::fs::create_dir_all(repo.join(f).parent().unwrap()).unwrap();
        std::fs::write(repo.join(f), "one\n").unwrap();
    }
    git_ok(repo, &["add", "."]);
    git_ok(repo, &["commit", "-q", "-m", "start"]);

    ok({
        let mut c = huddle(&db.url);
        c.args([
            "resource",
            "take",
            "--room",
            ROOM,
            "--agent",
            "ada",
            "file:src/**",
        ]);
        c.args(["--shared", "file:docs/**"]);
        c
    });
    let commit_as = |agent: Option<&str>, guard_off: bool, file: &str| {
        std::fs::write(repo.join(file), format!("{agent:?} {guard_off}\n")).unwrap();
        git_ok(repo, &["add", file]);
        let mut c = git(repo, &["commit", "-q", "-m", file]);
        if let Some(a) = agent {
            c.env("HUDDLE_AGENT", a);
        }
        if guard_off {
            c.env("HUDDLE_GUARD", "off");
        }
        run(c)
    };
    // bo touching ada's exclusive src/**: refused, with holder, expiry and override.
    let out = commit_as(Some("bo"), false, "src/a.rs");
    assert!(!out.status.success(), "the guard let bo commit src/a.rs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("src/a.rs: file:src/** is held exclusively by ada"),
        "{err}"
    );
    assert!(err.contains(" until 20"), "the expiry is shown: {err}");
    assert!(
        err.contains("HUDDLE_GUARD=off"),
        "the override is shown: {err}"
    );
    // Someone who is no agent at all is refused alike.
    assert!(!commit_as(None, false, "src/a.rs").status.success());
    // A shared holding guards nothing; ada commits her own; the override works.
    git_ok(repo, &["reset", "-q"]);
    assert!(commit_as(Some("bo"), false, "docs/x.md").status.success());
    assert!(commit_as(Some("ada"), false, "src/a.rs").status.success());
    assert!(commit_as(Some("bo"), true, "src/a.rs").status.success());
    // Moving a held file out of src/ touches it too.
    git_ok(repo, &["mv", "src/a.rs", "moved.rs"]);
    let mut c = git(repo, &["commit", "-q", "-m", "move"]);
    c.env("HUDDLE_AGENT", "bo");
    let out = run(c);
    assert!(
        !out.status.success(),
        "a rename out of src/ was let through"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("src/a.rs"));
    // Once ada releases, bo may.
    ok({
        let mut c = huddle(&db.url);
        c.args(["resource", "release", "--room", ROOM, "--agent", "ada"]);
        c
    });
    let mut c = git(repo, &["commit", "-q", "-m", "move"]);
    c.env("HUDDLE_AGENT", "bo");
    let out = run(c);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn eight_writers_read_modify_write_without_losing_an_update(backend: Backend) {
    let db = database(backend).await;
    let url = db.url.clone();
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let agent = format!("w{i}");
                let mut puts = 0u64;
                let mut stale = 0u64;
                while puts < 2 {
                    let got = ok({
                        let mut c = huddle(&url);
                        c.args(["state", "get", ROOM, "counter", "--json"]);
                        c
                    });
                    let got: serde_json::Value = serde_json::from_str(&got).expect("json");
                    let version = got["version"].as_u64().unwrap();
                    let value = got["value"].as_u64().unwrap_or(0);
                    let mut c = huddle(&url);
                    c.args(["state", "put", ROOM, "counter", &(value + 1).to_string()]);
                    c.args(["--agent", &agent, "--if-version", &version.to_string()]);
                    let out = run(c);
                    match out.status.code() {
                        Some(0) => puts += 1,
                        Some(4) => stale += 1,
                        _ => panic!("put failed: {}", String::from_utf8_lossy(&out.stderr)),
                    }
                }
                (puts, stale)
            })
        })
        .collect();
    let (mut puts, mut stale) = (0, 0);
    for w in writers {
        let (p, s) = w.join().expect("a writer");
        puts += p;
        stale += s;
    }
    let got: serde_json::Value = serde_json::from_str(&ok({
        let mut c = huddle(&url);
        c.args(["state", "get", ROOM, "counter", "--json", "--history"]);
        c
    }))
    .unwrap();
    assert_eq!(got["value"].as_u64(), Some(puts), "{got}");
    assert_eq!(got["version"].as_u64(), Some(puts));
    assert_eq!(
        got["history"].as_array().map(Vec::len),
        Some(puts as usize - 1)
    );
    eprintln!("{puts} puts, {stale} refused as stale");
}

/// A relay ends a driven agent's turn with SIGTERM to its process group; the agent's
/// `huddle mcp` gives back what it holds then, instead of leaving it to lapse.
async fn a_terminated_mcp_server_gives_its_holdings_back(backend: Backend) {
    use std::io::{BufRead as _, BufReader, Write as _};
    let db = database(backend).await;
    let mut server = huddle(&db.url)
        .args(["mcp", "--room", ROOM, "--agent", "ada"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start huddle mcp");
    let mut stdin = server.stdin.take().unwrap();
    let mut stdout = BufReader::new(server.stdout.take().unwrap());
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"resource_acquire","arguments":{"resources":[{"name":"api:deploy"}],"ttl_ms":600000}}}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    stdin.flush().unwrap();
    let mut answer = String::new();
    while !answer.contains("\"id\":2") {
        answer.clear();
        assert!(
            stdout.read_line(&mut answer).unwrap() > 0,
            "the server closed its output"
        );
    }
    assert!(
        answer.contains("api:deploy") && !answer.contains("isError\":true"),
        "{answer}"
    );
    let list = || {
        ok({
            let mut c = huddle(&db.url);
            c.args(["resource", "list", "--room", ROOM]);
            c
        })
    };
    assert!(list().contains("api:deploy exclusive by ada"));
    let termed = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(termed.success());
    let status = server.wait().unwrap();
    assert!(status.success(), "{status}");
    drop(stdin);
    // Given back at once: its ten-minute lease did not have to lapse.
    assert!(list().contains("no resources held"), "{}", list());
}
