//! In-process relays over one SQLite file: the relay loop end to end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use huddle_core::signing::OwnerSecret;
use huddle_core::sync::LocalAgent;
use huddle_core::{Fold, NewInteraction, Position, Role, TaskDag, Verb};
use huddle_relay::driver::{SimDriver, SimSettings};
use huddle_relay::{HostedAgent, Relay, RelayOptions};
use huddle_store::{Store, StoreOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

async fn store(path: &str, relay: &str) -> Arc<dyn Store> {
    huddle_store::open(
        path,
        StoreOptions {
            relay: relay.into(),
            ..Default::default()
        },
    )
    .await
    .expect("open store")
}

/// The room owner's key: owner commands count only when signed by it.
fn olga_key() -> OwnerSecret {
    OwnerSecret::from_seed([0x42; 32])
}

/// A fresh SQLite ledger holding room `lobby`, owned by `olga`: its directory (kept
/// alive by the caller), its path and the owner's store.
async fn lobby() -> (tempfile::TempDir, String, Arc<dyn Store>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("h.db").display().to_string();
    let admin = store(&path, "admin").await;
    admin
        .append(vec![NewInteraction::new(
            "lobby",
            Verb::RoomCreated,
            "olga",
            Role::Owner,
            json!({"owner": "olga", "key": olga_key().public().to_hex()}),
        )])
        .await
        .expect("room");
    (dir, path, admin)
}

fn sim_agent(key: &str, turn_ms: u64) -> HostedAgent {
    HostedAgent {
        local: LocalAgent::new(key),
        name: key.into(),
        driver: Arc::new(SimDriver::new(SimSettings {
            turn_ms,
            ..Default::default()
        })),
    }
}

async fn fold_all(store: &dyn Store) -> (TaskDag, Vec<huddle_core::Interaction>) {
    let mut dag = TaskDag::new();
    let mut rows = Vec::new();
    let mut cursor = Position::START;
    loop {
        let batch = store.read_forward(cursor, 1000).await.expect("read");
        if batch.next == cursor {
            break;
        }
        cursor = batch.next;
        for r in batch.rows {
            dag.apply(&r);
            rows.push(r);
        }
    }
    (dag, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_complete_a_delegated_dag_exactly_once() {
    let (_dir, path, admin) = lobby().await;

    let mut relays = Vec::new();
    let shutdown = CancellationToken::new();
    for r in 0..2 {
        let s = store(&path, &format!("relay-{r}")).await;
        let agents = vec![
            sim_agent(&format!("a{r}0"), 20),
            sim_agent(&format!("a{r}1"), 20),
        ];
        let relay = Relay::new(
            s,
            format!("relay-{r}"),
            vec!["lobby".into()],
            agents,
            RelayOptions::default(),
        );
        relays.push(tokio::spawn(relay.run(shutdown.clone())));
    }

    let mut text = String::from("!delegate\n");
    for i in 0..20 {
        if i >= 2 {
            text.push_str(&format!("t{i:02}: step {i} [after t{:02}]\n", i - 2));
        } else {
            text.push_str(&format!("t{i:02}: step {i}\n"));
        }
    }
    owner_command(&*admin, &text).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (dag, _) = fold_all(&*admin).await;
        let s = dag.summary("lobby");
        if s.total == 20 && s.done == 20 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all tasks done in time: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let mut hashes = Vec::new();
    for r in relays {
        let summary = r.await.expect("join").expect("relay ran");
        hashes.push(summary.tasks_hash.clone());
    }
    let (dag, rows) = fold_all(&*admin).await;
    // Every relay folded the same ledger into the same task state.
    assert_eq!(hashes[0], hashes[1]);
    assert_eq!(hashes[0], hex::encode(dag.state_hash()));
    // Exactly one accepted completion per task, in dependency order.
    let mut done_at: BTreeMap<String, usize> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        if r.verb == Verb::TaskCompleted {
            let task = r.body["task"].as_str().unwrap_or_default().to_string();
            assert!(
                done_at.insert(task.clone(), i).is_none(),
                "{task} completed twice"
            );
        }
    }
    assert_eq!(done_at.len(), 20);
    for i in 2..20 {
        assert!(done_at[&format!("t{i:02}")] > done_at[&format!("t{:02}", i - 2)]);
    }
    // The owner got a reply to the command.
    assert!(rows.iter().any(|r| r.verb == Verb::MessagePosted
        && r.role == Role::System
        && r.body["text"]
            .as_str()
            .unwrap_or("")
            .starts_with("Created 20 tasks")));
}

/// A relay that starts on a room whose owner commands were carried out already does
/// not write their results again (catching up, it derives every command's results
/// and drops those the ledger shows); the results of a command no relay carried out
/// yet are written once. Counted in rows sent, not rows stored (those dedupe).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_catching_up_does_not_rewrite_command_results() {
    let (_dir, path, admin) = lobby().await;
    let derived_from = |rows: &[huddle_core::Interaction], command: &str| {
        rows.iter()
            .filter(|r| r.parent.is_some_and(|p| p.to_string() == command))
            .count() as u64
    };
    let command_id = |rows: &[huddle_core::Interaction], text: &str| {
        rows.iter()
            .find(|r| r.verb == Verb::MessagePosted && r.body["text"] == text)
            .map(|r| r.id.to_string())
            .expect("command in the ledger")
    };
    let run = |id: &str, shutdown: &CancellationToken| {
        let (id, path, shutdown) = (id.to_string(), path.clone(), shutdown.clone());
        tokio::spawn(async move {
            let s = store(&path, &id).await;
            let relay = Relay::new(
                s,
                id,
                vec!["lobby".into()],
                vec![sim_agent("a0", 5)],
                RelayOptions::default(),
            );
            relay.run(shutdown).await
        })
    };
    // The first command is carried out by relay A.
    let first = "!delegate\nt1: one\nt2: two [after t1]\nt3: three [after t2]";
    owner_command(&*admin, first).await;
    let a_stop = CancellationToken::new();
    let a = run("relay-a", &a_stop);
    wait_ledger(&*admin, "A created the first command's tasks", |dag, _| {
        dag.summary("lobby").total == 3
    })
    .await;
    a_stop.cancel();
    let a = a.await.expect("join").expect("relay A ran");
    // The second command is posted while no relay runs, then relay B starts.
    let second = "!delegate\nu1: four";
    owner_command(&*admin, second).await;
    let b_stop = CancellationToken::new();
    let b = run("relay-b", &b_stop);
    wait_ledger(&*admin, "B created the second command's task", |dag, _| {
        dag.summary("lobby").total == 4
    })
    .await;
    // And a third one while B runs.
    let third = "!config reply-delay 0";
    owner_command(&*admin, third).await;
    wait_ledger(&*admin, "B answered the third command", |_, rows| {
        let id = command_id(rows, third);
        derived_from(rows, &id) > 0
    })
    .await;
    b_stop.cancel();
    let b = b.await.expect("join").expect("relay B ran");
    let (_, rows) = fold_all(&*admin).await;
    let first = derived_from(&rows, &command_id(&rows, first));
    let second = derived_from(&rows, &command_id(&rows, second));
    let third = derived_from(&rows, &command_id(&rows, third));
    assert!(
        first >= 4 && second >= 2 && third >= 1,
        "{first} {second} {third}"
    );
    assert_eq!(
        a.command_rows_sent, first,
        "A wrote the first command's results"
    );
    assert_eq!(
        b.command_rows_sent,
        second + third,
        "B wrote the results of the commands no relay had carried out, and no others"
    );
}

/// Relay `id` serving `lobby` with one simulated agent `agent`, running until
/// `shutdown`.
async fn run_relay(
    path: &str,
    id: &str,
    agent: &str,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<Result<huddle_relay::RelaySummary, huddle_relay::RelayError>> {
    let relay = Relay::new(
        store(path, id).await,
        id.to_string(),
        vec!["lobby".into()],
        vec![sim_agent(agent, 5)],
        RelayOptions::default(),
    );
    tokio::spawn(relay.run(shutdown.clone()))
}

/// The rows every owner command derived (those whose parent is a message the owner
/// posted), and the id of the message saying `text`.
fn command_rows(rows: &[huddle_core::Interaction]) -> u64 {
    let commands: std::collections::BTreeSet<_> = rows
        .iter()
        .filter(|r| r.verb == Verb::MessagePosted && r.role == Role::Owner)
        .map(|r| r.id)
        .collect();
    rows.iter()
        .filter(|r| r.parent.is_some_and(|p| commands.contains(&p)))
        .count() as u64
}

fn message_id(rows: &[huddle_core::Interaction], text: &str) -> huddle_core::InteractionId {
    rows.iter()
        .find(|r| r.verb == Verb::MessagePosted && r.body["text"] == text)
        .map(|r| r.id)
        .expect("message in the ledger")
}

/// Two relays serving the room both derive each owner command's results, and one of
/// them writes them (plan 0090): together they send exactly the rows the commands
/// derived, not twice as many. Counted in rows sent, not rows stored (those dedupe).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn command_results_are_written_by_one_relay() {
    let (_dir, path, admin) = lobby().await;
    let shutdown = CancellationToken::new();
    let relays = vec![
        run_relay(&path, "relay-0", "a0", &shutdown).await,
        run_relay(&path, "relay-1", "a1", &shutdown).await,
    ];
    // Both relays are serving before the commands come.
    owner_command(&*admin, "!config reply-delay 0").await;
    wait_ledger(&*admin, "the first command answered", |_, rows| {
        command_rows(rows) > 0
    })
    .await;
    let tasks: Vec<String> = (0..40).map(|i| format!("t{i}: task {i}")).collect();
    owner_command(&*admin, &format!("!delegate\n{}", tasks.join("\n"))).await;
    owner_command(&*admin, "!config max-turns 50").await;
    wait_ledger(&*admin, "every task created and done", |dag, _| {
        let s = dag.summary("lobby");
        s.total == 40 && s.done == 40
    })
    .await;
    wait_ledger(&*admin, "the last command answered", |_, rows| {
        let id = message_id(rows, "!config max-turns 50");
        rows.iter().any(|r| r.parent == Some(id))
    })
    .await;
    shutdown.cancel();
    let mut sent = 0;
    for r in relays {
        let summary = r.await.expect("join").expect("relay ran");
        sent += summary.command_rows_sent;
    }
    let (_, rows) = fold_all(&*admin).await;
    let derived = command_rows(&rows);
    assert!(derived >= 43, "{derived} rows derived");
    assert_eq!(
        sent, derived,
        "the two relays sent each command's results once between them"
    );
}

/// Owner commands posted together are answered in their order (plan 0090): each
/// relay turns to a command's results only once the previous command's are in the
/// ledger, whichever relay writes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn command_replies_follow_the_order_of_the_commands() {
    let (_dir, path, admin) = lobby().await;
    let shutdown = CancellationToken::new();
    let relays = vec![
        run_relay(&path, "relay-0", "a0", &shutdown).await,
        run_relay(&path, "relay-1", "a1", &shutdown).await,
    ];
    owner_command(&*admin, "!config reply-delay 0").await;
    wait_ledger(&*admin, "the relays answer", |_, rows| {
        command_rows(rows) > 0
    })
    .await;
    let texts: Vec<String> = (1..=8)
        .map(|i| format!("!config max-turns {}", 40 + i))
        .collect();
    let commands = admin
        .append(
            texts
                .iter()
                .map(|t| {
                    olga_key().sign(NewInteraction::new(
                        "lobby",
                        Verb::MessagePosted,
                        "olga",
                        Role::Owner,
                        json!({ "text": t }),
                    ))
                })
                .collect(),
        )
        .await
        .expect("the commands");
    let ids: Vec<_> = commands.iter().map(|a| a.id).collect();
    wait_ledger(&*admin, "every command answered", |_, rows| {
        ids.iter().all(|id| {
            rows.iter()
                .any(|r| r.parent == Some(*id) && r.verb == Verb::MessagePosted)
        })
    })
    .await;
    shutdown.cancel();
    for r in relays {
        r.await.expect("join").expect("relay ran");
    }
    let (_, rows) = fold_all(&*admin).await;
    let answered: Vec<_> = rows
        .iter()
        .filter(|r| r.verb == Verb::MessagePosted && r.role == Role::System)
        .filter_map(|r| ids.iter().position(|id| r.parent == Some(*id)))
        .collect();
    assert_eq!(
        answered,
        (0..8).collect::<Vec<_>>(),
        "replies in command order"
    );
}

/// The owner posts `text`, and `holder` takes its result claim for `lease` before any
/// relay runs: the claim's key and the answer.
async fn command_claimed_first(
    admin: &Arc<dyn Store>,
    text: &str,
    holder: &str,
    lease: Duration,
) -> (String, huddle_store::Acquired) {
    owner_command(&**admin, text).await;
    let (_, rows) = fold_all(&**admin).await;
    let key = huddle_core::protocol::command_result_key("lobby", &message_id(&rows, text));
    let answer = admin.acquire(&key, holder, lease).await.expect("acquire");
    (key, answer)
}

/// A relay that took an owner command's result claim and died before writing (here:
/// a holder that never writes) holds the results back only until its lease lapses:
/// the relay serving the room then takes the claim over and writes them, once, and
/// the claim ends closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_writer_of_command_results_is_taken_over() {
    let (_dir, path, admin) = lobby().await;
    let text = "!delegate\nt1: one\nt2: two [after t1]";
    let (key, dead) =
        command_claimed_first(&admin, text, "relay-dead", Duration::from_millis(1500)).await;
    let huddle_store::Acquired::Won(dead) = dead else {
        panic!("the claim was free: {dead:?}")
    };
    let shutdown = CancellationToken::new();
    let run = run_relay(&path, "relay-a", "a0", &shutdown).await;
    wait_ledger(&*admin, "the tasks created and done", |dag, _| {
        let s = dag.summary("lobby");
        s.total == 2 && s.done == 2
    })
    .await;
    shutdown.cancel();
    let summary = run.await.expect("join").expect("relay ran");
    let (_, rows) = fold_all(&*admin).await;
    let command = message_id(&rows, text);
    let results: Vec<_> = rows.iter().filter(|r| r.parent == Some(command)).collect();
    assert_eq!(results.len(), 3, "two tasks and the reply");
    for r in &results {
        assert!(
            r.at >= dead.expires_at,
            "{:?} written at {:?}, before the dead holder's lease lapsed at {:?}",
            r.verb,
            r.at,
            dead.expires_at
        );
    }
    assert_eq!(summary.command_rows_sent, 3, "written once");
    let after = admin
        .acquire(&key, "someone", Duration::from_secs(1))
        .await
        .expect("acquire");
    assert!(after.closed(), "the write closed the claim: {after:?}");
}

/// A holder of an owner command's result claim that keeps renewing it and never
/// writes (a relay gone wrong, or a hostile writer) holds the results back for at
/// most three of its leases: the relay serving the room then writes them without the
/// claim (plan 0090), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_that_never_writes_cannot_withhold_command_results() {
    let (_dir, path, admin) = lobby().await;
    let lease = Duration::from_millis(1_500);
    let (key, first) =
        command_claimed_first(&admin, "!delegate\nt1: one", "relay-stuck", lease).await;
    assert!(matches!(first, huddle_store::Acquired::Won(_)), "{first:?}");
    // The stuck holder renews every tenth of its lease, for as long as the test runs;
    // a renewal refused (its lease lapsed on a loaded machine) ends it, and is reported
    // below rather than left to show as a claim closed by the relay.
    let renewing = {
        let (admin, key) = (admin.clone(), key.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(lease / 10).await;
                let again = admin.acquire(&key, "relay-stuck", lease).await;
                if !matches!(again, Ok(huddle_store::Acquired::Won(_))) {
                    return format!("the stuck holder lost its claim: {again:?}");
                }
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = run_relay(&path, "relay-a", "a0", &shutdown).await;
    wait_ledger(&*admin, "the task created and done", |dag, _| {
        dag.summary("lobby").done == 1
    })
    .await;
    if renewing.is_finished() {
        panic!("{}", renewing.await.expect("the renewing task"));
    }
    renewing.abort();
    shutdown.cancel();
    let summary = run.await.expect("join").expect("relay ran");
    assert_eq!(summary.command_rows_sent, 2, "the task and the reply, once");
    let now = admin
        .acquire(&key, "someone", Duration::from_secs(1))
        .await
        .expect("acquire");
    assert!(
        !now.closed(),
        "written without the claim, which its holder kept: {now:?}"
    );
}

/// A reply turn in a thread gets the `<coordination>` block and a `<related-context>`
/// block with the related message of a sibling thread, before the message itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reply_prompt_carries_coordination_and_related_context() {
    use huddle_relay::driver::{ExecDriver, ExecSettings};
    let (_dir, path, admin) = lobby().await;
    let echo = HostedAgent {
        local: LocalAgent::new("bob"),
        name: "bob".into(),
        driver: Arc::new(ExecDriver::new(ExecSettings {
            command: vec!["cat".into()],
            timeout_ms: 10_000,
            max_reply_bytes: 64 * 1024,
            cwd: None,
            stop_grace_ms: 2_000,
        })),
    };
    let shutdown = CancellationToken::new();
    let relay = Relay::new(
        store(&path, "relay-0").await,
        "relay-0",
        vec!["lobby".into()],
        vec![echo, sim_agent("ada", 10)],
        RelayOptions::default(),
    );
    let handle = tokio::spawn(relay.run(shutdown.clone()));
    // Wait until the agent is registered, so the mention below addresses it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, rows) = fold_all(&*admin).await;
        if rows
            .iter()
            .filter(|r| r.verb == Verb::AgentRegistered)
            .count()
            == 2
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "agent never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sibling = NewInteraction::new(
        "lobby",
        Verb::MessagePosted,
        "hank",
        Role::Human,
        json!({"text": "the postgres migration fails with a lock timeout"}),
    )
    .in_thread("ops");
    let ask = NewInteraction::new(
        "lobby",
        Verb::MessagePosted,
        "hank",
        Role::Human,
        json!({"text": "@bob why does the postgres migration fail?"}),
    )
    .in_thread("dev");
    admin.append(vec![sibling]).await.expect("sibling");
    admin.append(vec![ask.clone()]).await.expect("ask");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let (_, rows) = fold_all(&*admin).await;
        if let Some(r) = rows.iter().find(|r| {
            r.verb == Verb::MessagePosted && r.actor == "bob" && r.parent == Some(ask.id())
        }) {
            break r.body["text"].as_str().unwrap_or_default().to_string();
        }
        assert!(tokio::time::Instant::now() < deadline, "bob never replied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    shutdown.cancel();
    handle.await.expect("join").expect("relay");
    let coord = reply.find("<coordination").expect("coordination block");
    let related = reply
        .find("<related-context>")
        .expect("related-context block");
    let message = reply
        .find("why does the postgres migration fail")
        .expect("the message");
    assert!(coord < related && related < message, "{reply}");
    assert!(reply.contains("lock timeout"), "{reply}");
    // The board shows the other agent, not the reader.
    assert!(reply[coord..related].contains("ada"), "{reply}");
}

/// A steady stream of ledger rows, each waking the relay's loop sooner than its
/// longest tick, does not starve the reconcile tick (and with it the relay id's
/// renewal and the heartbeat): heartbeats keep coming while the stream runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steady_stream_of_rows_does_not_starve_the_tick() {
    let (_dir, path, admin) = lobby().await;
    let shutdown = CancellationToken::new();
    let relay = Relay::new(
        store(&path, "relay-0").await,
        "relay-0",
        vec!["lobby".into()],
        vec![sim_agent("ada", 10)],
        RelayOptions {
            max_tick: Duration::from_millis(100),
            heartbeat_every: Duration::from_millis(100),
            ..Default::default()
        },
    );
    let handle = tokio::spawn(relay.run(shutdown.clone()));
    let beats = |rows: &[huddle_core::Interaction]| {
        rows.iter()
            .filter(|r| r.verb == Verb::RelayHeartbeat && r.actor == "relay-0")
            .count()
    };
    // Wait for the first heartbeat (written at start).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while beats(&fold_all(&*admin).await.1) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no first heartbeat");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Rows the relay reads but acts on nothing for (another relay's heartbeats),
    // one every few milliseconds: each is an event for the loop.
    let flood_stop = CancellationToken::new();
    let flood = {
        let stop = flood_stop.clone();
        let admin = admin.clone();
        tokio::spawn(async move {
            let mut beat = 0u64;
            while !stop.is_cancelled() {
                beat += 1;
                let body = huddle_core::protocol::RelayHeartbeatBody {
                    relay: "elsewhere".into(),
                    instance: "x".into(),
                    beat,
                    version: "0".into(),
                    agents: vec![],
                    behind: 0,
                };
                admin
                    .append(vec![NewInteraction::new(
                        "lobby",
                        Verb::RelayHeartbeat,
                        "elsewhere",
                        Role::System,
                        body.to_body(),
                    )])
                    .await
                    .expect("flood row");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            beat
        })
    };
    // Ten heartbeats are due within about a second; a starved tick (the loop's
    // sleep re-armed by every event) writes one every several seconds at best.
    let start = beats(&fold_all(&*admin).await.1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = beats(&fold_all(&*admin).await.1);
        if now >= start + 10 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tick starved: {} heartbeats during the stream",
            now - start
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    flood_stop.cancel();
    let flooded = flood.await.expect("flood");
    assert!(
        flooded > 20,
        "the stream was too thin to test anything: {flooded} rows"
    );
    shutdown.cancel();
    handle.await.expect("join").expect("relay ran");
}

/// An owner command, signed with the room owner's key.
async fn owner_command(admin: &dyn Store, text: &str) {
    admin
        .append(vec![olga_key().sign(NewInteraction::new(
            "lobby",
            Verb::MessagePosted,
            "olga",
            Role::Owner,
            json!({ "text": text }),
        ))])
        .await
        .expect("owner command");
}

/// Waits (bounded) until `ok` holds for the ledger.
async fn wait_ledger(
    admin: &dyn Store,
    what: &str,
    ok: impl Fn(&TaskDag, &[huddle_core::Interaction]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (dag, rows) = fold_all(admin).await;
        if ok(&dag, &rows) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A driver that, on its first turn, blocks the thread it runs on until `resume`
/// is set (bounded), then runs the turn with `inner`. On a current-thread runtime
/// that freezes the whole relay — reads, ticks, renewals — as SIGSTOP would, at the
/// point between the relay's last claim check and the agent's start; the process
/// spawner thread and the agent's child process are not stopped.
struct PausedOnce {
    inner: huddle_relay::driver::ExecDriver,
    paused: std::sync::atomic::AtomicBool,
    holding: Arc<std::sync::atomic::AtomicBool>,
    resume: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl huddle_relay::driver::Driver for PausedOnce {
    async fn run(
        &self,
        request: huddle_relay::driver::TurnRequest,
        cancel: CancellationToken,
    ) -> huddle_relay::driver::TurnOutcome {
        use std::sync::atomic::Ordering;
        if !self.paused.swap(true, Ordering::SeqCst) {
            self.holding.store(true, Ordering::SeqCst);
            let until = std::time::Instant::now() + Duration::from_secs(60);
            while !self.resume.load(Ordering::SeqCst) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.inner.run(request, cancel).await
    }
}

/// A relay paused between confirming a turn's claims and starting its agent, for
/// longer than the lease, while another relay re-takes the task and finishes it:
/// once resumed it never starts the agent (its start deadline has passed), so no
/// execution starts after the completion was committed. Counted in executions: the
/// agents are exec scripts that log every real start.
#[test]
fn a_relay_paused_before_starting_its_agent_never_starts_it_late() {
    use huddle_relay::driver::{ExecDriver, ExecSettings};
    use std::sync::atomic::{AtomicBool, Ordering};

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (_dir, path, admin) = rt.block_on(lobby());
    let log = std::path::Path::new(&path).with_file_name("starts.log");
    let recording = |agent: &str| {
        ExecDriver::new(ExecSettings {
            command: vec![
                "sh".into(),
                "-c".into(),
                format!(
                    "echo \"start {agent} $HUDDLE_TASK $HUDDLE_EPOCH $(date +%s%6N)\" >> {}; echo done",
                    log.display()
                ),
            ],
            timeout_ms: 30_000,
            max_reply_bytes: 1024,
            cwd: None,
            stop_grace_ms: 1_000,
        })
    };
    let starts = || -> Vec<(String, i64)> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 5).then(|| (f[1].to_string(), f[4].parse().unwrap_or(0)))
            })
            .collect()
    };
    rt.block_on(async {
        owner_command(&*admin, "!config claim-ttl 1s").await;
        owner_command(&*admin, "!config allocation push").await;
    });

    // Relay A, on a thread and runtime of its own, hosts ada behind the pause.
    let holding = Arc::new(AtomicBool::new(false));
    let resume = Arc::new(AtomicBool::new(false));
    let ada = HostedAgent {
        local: LocalAgent::new("ada"),
        name: "ada".into(),
        driver: Arc::new(PausedOnce {
            inner: recording("ada"),
            paused: AtomicBool::new(false),
            holding: holding.clone(),
            resume: resume.clone(),
        }),
    };
    let stop_a = CancellationToken::new();
    let relay_a = {
        let path = path.clone();
        let stop = stop_a.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let relay = Relay::new(
                    store(&path, "relay-a").await,
                    "relay-a",
                    vec!["lobby".into()],
                    vec![ada],
                    RelayOptions::default(),
                );
                relay.run(stop).await
            })
        })
    };
    let bob = HostedAgent {
        local: LocalAgent::new("bob"),
        name: "bob".into(),
        driver: Arc::new(recording("bob")),
    };
    let stop_b = CancellationToken::new();
    let relay = Relay::new(
        rt.block_on(store(&path, "relay-b")),
        "relay-b",
        vec!["lobby".into()],
        vec![bob],
        RelayOptions::default(),
    );
    let relay_b = rt.spawn(relay.run(stop_b.clone()));

    rt.block_on(async {
        wait_ledger(&*admin, "both agents registered", |_, rows| {
            rows.iter()
                .filter(|r| r.verb == Verb::AgentRegistered)
                .count()
                == 2
        })
        .await;
        // The task is ada's to take first (push); relay A takes it and is paused
        // right before starting ada.
        owner_command(&*admin, "!delegate\nt1: the job @ada").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !holding.load(Ordering::SeqCst) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "relay A never reached ada's start"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Meanwhile ada's lease lapses; relay B re-takes the task and bob finishes it.
        wait_ledger(&*admin, "bob completes t1", |dag, _| {
            dag.task("lobby", "t1")
                .is_some_and(|t| t.status == huddle_core::TaskStatus::Done)
        })
        .await;
    });
    resume.store(true, Ordering::SeqCst);
    // Relay A resumes; its turn ends (a late run's completion would be refused by
    // its fence: either way the turn is recorded as failed).
    rt.block_on(async {
        wait_ledger(&*admin, "relay A reports ada's turn", |_, rows| {
            rows.iter()
                .any(|r| r.verb == Verb::TurnFailed && r.actor == "ada")
        })
        .await;
    });
    stop_a.cancel();
    stop_b.cancel();
    let summary_a = relay_a.join().expect("relay A thread").expect("relay A");
    rt.block_on(relay_b).expect("join").expect("relay B");
    let (_, rows) = rt.block_on(fold_all(&*admin));
    let completed_at = rows
        .iter()
        .find(|r| r.verb == Verb::TaskCompleted)
        .map(|r| r.at.as_micros())
        .expect("a completion");
    let starts = starts();
    assert_eq!(
        starts.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
        vec!["bob"],
        "only bob ran t1: {starts:?}"
    );
    // The database clock is kept to the millisecond (rounded), the agent's to the
    // microsecond: a start less than a millisecond before the completion may read
    // as a little after it.
    assert!(
        starts.iter().all(|(_, at)| *at < completed_at + 1_000),
        "bob started before the completion at {completed_at}: {starts:?}"
    );
    let reason = rows
        .iter()
        .find(|r| r.verb == Verb::TurnFailed && r.actor == "ada")
        .and_then(|r| r.body["reason"].as_str())
        .unwrap_or_default();
    assert!(reason.starts_with("not started"), "{reason}");
    assert_eq!(summary_a.turns_not_started, 1, "{summary_a:?}");
    assert_eq!(summary_a.turns_started, 0, "{summary_a:?}");
}

/// A relay that keeps a snapshot resumes from it at its next start: it reads only the
/// rows appended since, runs the tasks delegated while it was down, never runs a
/// finished task again (turns counted, not rows), and folds to the same state as a
/// fold of every row. A snapshot it cannot trust — a flipped byte, another relay
/// configuration, another database — is refused and the relay reads from the first row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_resumes_from_its_snapshot_and_runs_each_task_once() {
    let (dir, path, admin) = lobby().await;
    let snapshot = dir.path().join("relay-a.snapshot");
    let run =
        |path: &str, agent: &str, snapshot: &std::path::Path, shutdown: &CancellationToken| {
            let (path, agent, shutdown) = (path.to_string(), agent.to_string(), shutdown.clone());
            let options = RelayOptions {
                snapshot: Some(snapshot.to_path_buf()),
                snapshot_every_rows: 1,
                snapshot_min_interval: Duration::ZERO,
                ..RelayOptions::default()
            };
            tokio::spawn(async move {
                let s = store(&path, "relay-a").await;
                let relay = Relay::new(
                    s,
                    "relay-a",
                    vec!["lobby".into()],
                    vec![sim_agent(&agent, 5)],
                    options,
                );
                relay.run(shutdown).await
            })
        };
    let until_done = |n: usize| {
        move |dag: &TaskDag, _: &[huddle_core::Interaction]| {
            let s = dag.summary("lobby");
            s.total == n && s.done == n
        }
    };
    let beats = |rows: &[huddle_core::Interaction]| {
        rows.iter()
            .filter(|r| r.verb == Verb::RelayHeartbeat)
            .count()
    };
    // Runs the relay until `n` tasks are done, it has started (its first heartbeat
    // follows its start-up) and a snapshot exists.
    let run_until = |n: usize, agent: &'static str| {
        let (path, admin, snapshot) = (path.clone(), admin.clone(), snapshot.clone());
        async move {
            let (_, rows) = fold_all(&*admin).await;
            let before = beats(&rows);
            let stop = CancellationToken::new();
            let relay = run(&path, agent, &snapshot, &stop);
            wait_ledger(&*admin, &format!("{n} tasks done"), |dag, rows| {
                until_done(n)(dag, rows) && beats(rows) > before && snapshot.exists()
            })
            .await;
            stop.cancel();
            relay.await.expect("join").expect("relay ran")
        }
    };
    owner_command(&*admin, "!delegate\nt1: one\nt2: two [after t1]\nt3: three").await;
    let first = run_until(3, "a0").await;
    assert_eq!(first.rows_resumed, 0, "no snapshot on the first start");
    assert!(first.snapshots_written >= 1, "{first:?}");
    assert!(snapshot.exists());

    // Delegated while the relay is down; it resumes and runs only the new ones.
    owner_command(&*admin, "!delegate\nu1: four [after t3]\nu2: five").await;
    let (_, rows_before) = fold_all(&*admin).await;
    let second = run_until(5, "a0").await;
    assert!(
        second.rows_resumed > 0 && second.rows_read < rows_before.len() as u64,
        "it resumed and read only the rows since: {second:?}"
    );
    assert_eq!(
        first.turns_started + second.turns_started,
        5,
        "each task ran once"
    );
    let (dag, _) = fold_all(&*admin).await;
    assert_eq!(second.tasks_hash, hex::encode(dag.state_hash()));

    // A flipped byte in the body: refused, read from the first row, nothing re-run.
    let mut bytes = std::fs::read(&snapshot).expect("snapshot");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&snapshot, &bytes).expect("write");
    let third = run_until(5, "a0").await;
    assert_eq!(third.rows_resumed, 0, "a corrupt snapshot is not used");
    assert_eq!(third.turns_started, 0);
    assert_eq!(third.tasks_hash, second.tasks_hash);

    // Rewritten by that start: resumed again. Then under another configuration (other
    // agents): refused.
    let fourth = run_until(5, "a0").await;
    assert!(fourth.rows_resumed > 0, "{fourth:?}");
    let fifth = run_until(5, "b0").await;
    assert_eq!(
        fifth.rows_resumed, 0,
        "another configuration's snapshot is not used"
    );
    assert_eq!(fourth.turns_started + fifth.turns_started, 0);

    // Another database: its ledger lacks the snapshot's last row.
    let (_other_dir, other_path, other_admin) = lobby().await;
    owner_command(&*other_admin, "!delegate\nv1: six").await;
    let stop = CancellationToken::new();
    let relay = run(&other_path, "b0", &snapshot, &stop);
    wait_ledger(&*other_admin, "v1 done", until_done(1)).await;
    stop.cancel();
    let other = relay.await.expect("join").expect("relay ran");
    assert_eq!(
        other.rows_resumed, 0,
        "a snapshot of another database is not used"
    );
    assert_eq!(other.turns_started, 1);
}

/// Counts the turns it really runs (side effects, not rows), then runs them with the
/// simulated driver.
struct Counted {
    inner: SimDriver,
    runs: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait::async_trait]
impl huddle_relay::driver::Driver for Counted {
    async fn run(
        &self,
        request: huddle_relay::driver::TurnRequest,
        cancel: CancellationToken,
    ) -> huddle_relay::driver::TurnOutcome {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.run(request, cancel).await
    }
}

/// Simulated agents `a0`, `a1`, ... whose turns take `turn_ms` each, every turn
/// counted in `runs`.
fn counted_agents(turn_ms: &[u64], runs: &Arc<std::sync::atomic::AtomicUsize>) -> Vec<HostedAgent> {
    turn_ms
        .iter()
        .enumerate()
        .map(|(i, ms)| HostedAgent {
            local: LocalAgent::new(format!("a{i}")),
            name: format!("a{i}"),
            driver: Arc::new(Counted {
                inner: SimDriver::new(SimSettings {
                    turn_ms: *ms,
                    ..Default::default()
                }),
                runs: runs.clone(),
            }),
        })
        .collect()
}

/// Plan 0081: task turns of one relay that end apart, in passes of their own, share
/// one write when they end within the relay's batch hold — one `task.lot` row closing
/// all their claims — and each goes alone when the hold is zero. Either way every
/// task runs once and completes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn task_results_ending_within_the_hold_share_one_write() {
    for (hold, lots_expected) in [(Duration::from_secs(5), 1usize), (Duration::ZERO, 0)] {
        let (_dir, path, admin) = lobby().await;
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Four agents whose turns end 40 ms apart.
        let agents = counted_agents(&[40, 80, 120, 160], &runs);
        let shutdown = CancellationToken::new();
        let relay = Relay::new(
            store(&path, "relay-0").await,
            "relay-0",
            vec!["lobby".into()],
            agents,
            RelayOptions {
                batch_hold: hold,
                ..RelayOptions::default()
            },
        );
        let running = tokio::spawn(relay.run(shutdown.clone()));
        owner_command(
            &*admin,
            "!delegate\nt1: one\nt2: two\nt3: three\nt4: four\n",
        )
        .await;
        wait_ledger(&*admin, "four tasks done", |dag, _| {
            let s = dag.summary("lobby");
            s.total == 4 && s.done == 4
        })
        .await;
        shutdown.cancel();
        running.await.expect("join").expect("relay ran");
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            4,
            "hold {hold:?}"
        );
        // The rows as stored: lots are containers here.
        let mut stored = Vec::new();
        let mut cursor = Position::START;
        loop {
            let batch = admin
                .read_room_rows("lobby", cursor, 1000)
                .await
                .expect("read rows");
            if batch.next == cursor {
                break;
            }
            cursor = batch.next;
            stored.extend(batch.rows);
        }
        let lots: Vec<_> = stored.iter().filter(|r| r.verb == Verb::TaskLot).collect();
        let completions_in_lots: usize = lots
            .iter()
            .map(|l| {
                l.body["items"].as_array().map_or(0, |items| {
                    items
                        .iter()
                        .filter(|i| i["verb"] == "task.completed")
                        .count()
                })
            })
            .sum();
        let completion_rows = stored
            .iter()
            .filter(|r| r.verb == Verb::TaskCompleted)
            .count();
        // The hand-off of four fresh tasks is a lot of its own; count result lots.
        let result_lots = lots
            .iter()
            .filter(|l| {
                l.body["items"]
                    .as_array()
                    .is_some_and(|items| items.iter().any(|i| i["verb"] == "task.completed"))
            })
            .count();
        assert_eq!(result_lots, lots_expected, "hold {hold:?}: {lots:?}");
        assert_eq!(completions_in_lots + completion_rows, 4, "hold {hold:?}");
        if lots_expected == 1 {
            assert_eq!(completions_in_lots, 4, "all four results in the one lot");
        }
    }
}

/// An agent's idle time between turns is measured on the relay (plan 0083): one gap
/// per turn after its first, and a gap spent waiting for work is counted whole.
#[tokio::test]
async fn an_agents_idle_time_between_turns_is_measured() {
    let (_dir, path, admin) = lobby().await;
    let shutdown = CancellationToken::new();
    let relay = Relay::new(
        store(&path, "relay-0").await,
        "relay-0",
        vec!["lobby".into()],
        vec![sim_agent("ada", 20)],
        RelayOptions::default(),
    );
    let running = tokio::spawn(relay.run(shutdown.clone()));
    owner_command(&*admin, "!delegate\nt1: one\nt2: two\nt3: three\n").await;
    wait_ledger(&*admin, "three tasks done", |dag, _| {
        dag.summary("lobby").done == 3
    })
    .await;
    // The agent now waits for work: a known idle time before the fourth task.
    tokio::time::sleep(Duration::from_millis(300)).await;
    owner_command(&*admin, "!delegate\nt4: four\n").await;
    wait_ledger(&*admin, "four tasks done", |dag, _| {
        dag.summary("lobby").done == 4
    })
    .await;
    shutdown.cancel();
    let summary = running.await.expect("join").expect("relay ran");
    assert_eq!(summary.turns_started, 4);
    let gaps = &summary.agent_idle;
    // Four turns of one agent, one after another: three gaps.
    assert_eq!(gaps.total(), 3, "{gaps:?}");
    // The longest is the wait for the fourth task: at least the 300 ms it had no work.
    let longest = gaps.quantile_us(1.0).expect("a bucket within 10 s");
    assert!(longest >= 300_000, "longest gap {longest} µs: {gaps:?}");
    // The two between tasks that were ready were shorter.
    let shorter = gaps.quantile_us(0.5).expect("a bucket");
    assert!(shorter < longest, "{gaps:?}");
}

/// A store that holds every batch statement (a batch acquire or a hand-off) for
/// `hold` before performing it, and counts how many run at once (plan 0087).
struct HeldBatches {
    inner: Arc<dyn Store>,
    hold: Duration,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl HeldBatches {
    async fn held<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        use std::sync::atomic::Ordering;
        let at_once = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(at_once, Ordering::SeqCst);
        tokio::time::sleep(self.hold).await;
        let out = call.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

#[async_trait::async_trait]
impl huddle_store::Ledger for HeldBatches {
    fn limits(&self) -> &huddle_core::Limits {
        self.inner.limits()
    }
    async fn append(
        &self,
        batch: Vec<NewInteraction>,
    ) -> huddle_store::Result<Vec<huddle_store::Appended>> {
        self.inner.append(batch).await
    }
    async fn append_fenced(
        &self,
        fence: &huddle_store::Fence,
        batch: Vec<NewInteraction>,
    ) -> huddle_store::Result<Vec<huddle_store::Appended>> {
        self.inner.append_fenced(fence, batch).await
    }
    async fn append_under(
        &self,
        fences: &[huddle_store::Fence],
        close: bool,
        batch: Vec<NewInteraction>,
    ) -> huddle_store::Result<Vec<huddle_store::Appended>> {
        self.inner.append_under(fences, close, batch).await
    }
    async fn read_forward(
        &self,
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<huddle_store::ReadBatch> {
        self.inner.read_forward(after, limit).await
    }
    async fn read_room(
        &self,
        room: &str,
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<huddle_store::ReadBatch> {
        self.inner.read_room(room, after, limit).await
    }
    async fn read_rooms(
        &self,
        rooms: &[String],
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<huddle_store::ReadBatch> {
        self.inner.read_rooms(rooms, after, limit).await
    }
    async fn read_room_rows(
        &self,
        room: &str,
        after: Position,
        limit: usize,
    ) -> huddle_store::Result<huddle_store::ReadBatch> {
        self.inner.read_room_rows(room, after, limit).await
    }
    async fn get(
        &self,
        id: huddle_core::InteractionId,
    ) -> huddle_store::Result<Option<huddle_core::Interaction>> {
        self.inner.get(id).await
    }
    fn doorbell(&self) -> huddle_store::Doorbell {
        self.inner.doorbell()
    }
    async fn now(&self) -> huddle_store::Result<huddle_core::Timestamp> {
        self.inner.now().await
    }
    fn poll_interval(&self) -> Duration {
        self.inner.poll_interval()
    }
    async fn flush(&self) {
        self.inner.flush().await
    }
}

#[async_trait::async_trait]
impl huddle_store::Claims for HeldBatches {
    async fn acquire_request(
        &self,
        request: &huddle_store::ClaimRequest,
    ) -> huddle_store::Result<huddle_store::Acquired> {
        self.inner.acquire_request(request).await
    }
    async fn acquire_batch(
        &self,
        requests: &[huddle_store::ClaimRequest],
    ) -> huddle_store::Result<Vec<Option<huddle_store::Acquired>>> {
        self.held(self.inner.acquire_batch(requests)).await
    }
    async fn renew(
        &self,
        key: &str,
        holder: &str,
        epoch: huddle_store::Epoch,
        ttl: Duration,
    ) -> huddle_store::Result<Option<huddle_store::ClaimState>> {
        self.inner.renew(key, holder, epoch, ttl).await
    }
    async fn release(
        &self,
        key: &str,
        holder: &str,
        epoch: huddle_store::Epoch,
    ) -> huddle_store::Result<bool> {
        self.inner.release(key, holder, epoch).await
    }
    async fn list_claims(&self, prefix: &str) -> huddle_store::Result<Vec<huddle_store::ClaimRow>> {
        self.inner.list_claims(prefix).await
    }
    async fn acquire_resources(
        &self,
        room: &str,
        holder: &str,
        wanted: &[huddle_core::resources::Wanted],
        ttl: Duration,
    ) -> huddle_store::Result<huddle_store::ResourcesAcquired> {
        self.inner
            .acquire_resources(room, holder, wanted, ttl)
            .await
    }
}

#[async_trait::async_trait]
impl Store for HeldBatches {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn writer(&self) -> Option<String> {
        self.inner.writer()
    }
    fn signer(&self) -> Option<huddle_core::keys::WriterKey> {
        self.inner.signer()
    }
    async fn acquire_and_append(
        &self,
        requests: &[huddle_store::ClaimRequest],
        appends: Vec<huddle_store::ConditionalAppend>,
    ) -> huddle_store::Result<huddle_store::Handoff> {
        self.held(self.inner.acquire_and_append(requests, appends))
            .await
    }
    async fn append_then_hand_off(
        &self,
        first: huddle_store::FencedWrite,
        requests: &[huddle_store::ClaimRequest],
        appends: Vec<huddle_store::ConditionalAppend>,
    ) -> huddle_store::Result<(Vec<huddle_store::Appended>, huddle_store::Handoff)> {
        self.held(self.inner.append_then_hand_off(first, requests, appends))
            .await
    }
    async fn archive_room(
        &self,
        request: huddle_store::ArchiveRequest,
    ) -> huddle_store::Result<huddle_store::ArchiveOutcome> {
        self.inner.archive_room(request).await
    }
    async fn prune_claims(
        &self,
        older_than: Duration,
    ) -> huddle_store::Result<huddle_store::PrunedClaims> {
        self.inner.prune_claims(older_than).await
    }
}

/// Plan 0087: a relay keeps at most `batches_in_flight` batches of results and claims
/// in flight. Four agents whose turns end 40 ms apart, each batch statement held
/// 300 ms by the store: with two allowed, a second batch goes while the first is
/// held; with the default one, never. Either way every task's turn runs exactly once
/// (counted at the driver) and every task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_overlaps_at_most_its_batches_in_flight() {
    for (allowed, want_most) in [(2usize, 2usize), (1, 1)] {
        let (_dir, path, admin) = lobby().await;
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let agents = counted_agents(&[20, 60, 100, 140], &runs);
        let held = Arc::new(HeldBatches {
            inner: store(&path, "relay-0").await,
            hold: Duration::from_millis(300),
            now: Default::default(),
            most: Default::default(),
        });
        let shutdown = CancellationToken::new();
        let relay = Relay::new(
            held.clone(),
            "relay-0",
            vec!["lobby".into()],
            agents,
            RelayOptions {
                batch_hold: Duration::ZERO,
                batches_in_flight: allowed,
                ..RelayOptions::default()
            },
        );
        let running = tokio::spawn(relay.run(shutdown.clone()));
        let tasks: String = (1..=12).map(|i| format!("t{i}: task {i}\n")).collect();
        owner_command(&*admin, &format!("!delegate\n{tasks}")).await;
        wait_ledger(&*admin, "twelve tasks done", |dag, _| {
            let s = dag.summary("lobby");
            s.total == 12 && s.done == 12
        })
        .await;
        shutdown.cancel();
        running.await.expect("join").expect("relay ran");
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            12,
            "{allowed} in flight: each task's turn ran once"
        );
        assert_eq!(
            held.most.load(std::sync::atomic::Ordering::SeqCst),
            want_most,
            "{allowed} allowed in flight"
        );
    }
}
