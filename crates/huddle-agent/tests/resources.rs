//! Shared resources and versioned shared state through agent sessions, over the
//! in-memory store (a clock moved by hand where leases must lapse).

use std::sync::Arc;
use std::time::Duration;

use huddle_agent::resource_views::{
    ResourceAcquireArgs, ResourceNamesArgs, ResourceSpec, ResourcesArgs, StateGetArgs, StatePutArgs,
};
use huddle_agent::{AgentError, AgentSession};
use huddle_core::signing::OwnerSecret;
use huddle_core::{Position, Timestamp, Verb};
use huddle_store::memory::{ManualClock, MemoryStore};
use huddle_store::{Store, StoreOptions};
use serde_json::json;

const ROOM: &str = "ops";

async fn room(clock: Option<ManualClock>) -> Arc<dyn Store> {
    let options = StoreOptions {
        poll_interval: Duration::from_millis(20),
        ..Default::default()
    };
    let store: Arc<dyn Store> = match clock {
        Some(c) => Arc::new(MemoryStore::with_clock(options, c)),
        None => Arc::new(MemoryStore::new(options)),
    };
    let owner = OwnerSecret::from_seed([9; 32]);
    store
        .append(huddle_core::seed_room(ROOM, "ana", &owner, &[]).unwrap())
        .await
        .unwrap();
    store
}

async fn agent(store: &Arc<dyn Store>, name: &str) -> Arc<AgentSession> {
    Arc::new(
        AgentSession::open(store.clone(), ROOM, name, vec![])
            .await
            .unwrap(),
    )
}

async fn count(store: &Arc<dyn Store>, verb: Verb) -> usize {
    let batch = store
        .read_room(ROOM, Position::START, 10_000)
        .await
        .unwrap();
    batch.rows.iter().filter(|r| r.verb == verb).count()
}

fn spec(name: &str, mode: &str) -> ResourceSpec {
    ResourceSpec {
        name: name.into(),
        mode: Some(mode.into()),
        permits: None,
    }
}

fn take(specs: Vec<ResourceSpec>, ttl_ms: u64, wait_ms: u64) -> ResourceAcquireArgs {
    ResourceAcquireArgs {
        resources: specs,
        ttl_ms: Some(ttl_ms),
        wait_ms: Some(wait_ms),
        reason: Some("refactoring".into()),
    }
}

#[tokio::test]
async fn a_holder_blocks_shows_on_the_board_and_a_waiter_gets_it_on_release() {
    let store = room(None).await;
    let (ada, bo) = (agent(&store, "ada").await, agent(&store, "bo").await);
    let won = ada
        .resource_acquire(take(vec![spec("file:src/**", "exclusive")], 60_000, 0))
        .await
        .unwrap();
    assert_eq!(won.resources[0].name, "file:src/**");
    let busy = bo
        .resource_acquire(take(vec![spec("file:src/main.rs", "shared")], 60_000, 0))
        .await
        .unwrap_err();
    assert!(matches!(busy, AgentError::ResourcesBusy { .. }), "{busy}");
    let text = busy.to_string();
    assert!(
        text.contains("held by ada") && text.contains("until"),
        "{text}"
    );
    // The board shows who holds what until when.
    let block = bo.board().await.unwrap().coordination.expect("a block");
    assert!(
        block.contains("resources held:\n- file:src/** exclusive by ada until "),
        "{block}"
    );
    let listed = bo
        .resources(ResourcesArgs {
            path: Some("src/lib.rs".into()),
        })
        .await
        .unwrap();
    assert_eq!(listed.held.len(), 1);
    assert!(listed.mine.is_empty());
    // bo waits; ada gives it back meanwhile.
    let waiter = {
        let bo = bo.clone();
        tokio::spawn(async move {
            bo.resource_acquire(take(
                vec![spec("file:src/main.rs", "shared")],
                60_000,
                5_000,
            ))
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = ada
        .resource_release(ResourceNamesArgs::default())
        .await
        .unwrap();
    assert_eq!(released.resources.len(), 1);
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(got.resources[0].holder, "bo");
    assert_eq!(count(&store, Verb::ResourceAcquired).await, 2);
    assert_eq!(count(&store, Verb::ResourceReleased).await, 1);
    let block = ada.board().await.unwrap().coordination.expect("a block");
    assert!(block.contains("file:src/main.rs shared by bo"), "{block}");
    assert!(!block.contains("by ada until"), "{block}");
}

#[tokio::test]
async fn kept_holdings_are_renewed_while_the_session_runs() {
    let store = room(None).await;
    let ada = agent(&store, "ada").await;
    let keeper = {
        let ada = ada.clone();
        tokio::spawn(async move { ada.keep_resources().await })
    };
    let won = ada
        .resource_acquire(take(vec![spec("api:github", "exclusive")], 600, 0))
        .await
        .unwrap();
    let first = won.resources[0].expires_at;
    // Renewed at a third of the lease: well before it would lapse.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count(&store, Verb::ResourceRenewed).await < 3 {
        assert!(tokio::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = ada.resources(ResourcesArgs::default()).await.unwrap();
    assert_eq!(now.mine.len(), 1, "still held well past its first expiry");
    assert!(now.mine[0].expires_at > first);
    assert!(now.now > first, "the first lease would have lapsed by now");
    ada.release_kept().await.unwrap();
    assert!(ada
        .resources(ResourcesArgs::default())
        .await
        .unwrap()
        .held
        .is_empty());
    keeper.abort();
}

#[tokio::test]
async fn a_lapsed_holding_is_taken_over_and_its_renewal_refused() {
    let clock = ManualClock::new(Timestamp(1_000_000_000));
    let store = room(Some(clock.clone())).await;
    let (ada, bo) = (agent(&store, "ada").await, agent(&store, "bo").await);
    let slot = || ResourceSpec {
        name: "slot:build".into(),
        mode: Some("permits".into()),
        permits: Some(1),
    };
    ada.resource_acquire(take(vec![slot()], 1_000, 0))
        .await
        .unwrap();
    assert!(bo
        .resource_acquire(take(vec![slot()], 1_000, 0))
        .await
        .is_err());
    clock.advance(Duration::from_millis(1_001));
    let got = bo
        .resource_acquire(take(vec![slot()], 1_000, 0))
        .await
        .unwrap();
    assert_eq!(got.resources[0].holder, "bo");
    let lost = ada
        .resource_renew(ResourceNamesArgs::default())
        .await
        .unwrap_err();
    assert!(
        matches!(lost, AgentError::NotResourceHolder { .. }),
        "{lost}"
    );
    // The board no longer shows ada's lapsed holding.
    let block = bo.board().await.unwrap().coordination.unwrap();
    assert!(block.contains("slot:build permits-1 by bo"), "{block}");
    assert!(!block.contains("by ada"), "{block}");
}

#[tokio::test]
async fn puts_on_a_stale_version_are_refused_with_the_current_one() {
    let store = room(None).await;
    let (ada, bo) = (agent(&store, "ada").await, agent(&store, "bo").await);
    let put = |value, if_version| StatePutArgs {
        key: "plan/owner".into(),
        value,
        if_version,
    };
    let w = ada.state_put(put(json!("ada"), Some(0))).await.unwrap();
    assert_eq!(w.state.version, 1);
    let stale = bo.state_put(put(json!("bo"), Some(0))).await.unwrap_err();
    match &stale {
        AgentError::StaleVersion { current, value, .. } => {
            assert_eq!(*current, 1);
            assert_eq!(value, "\"ada\"");
        }
        other => panic!("expected stale, got {other}"),
    }
    assert!(stale.to_string().contains("if_version 1"), "{stale}");
    // A version that was never written is not a base.
    assert!(bo.state_put(put(json!("x"), Some(7))).await.is_err());
    // Without if_version: on top of the current.
    assert_eq!(
        bo.state_put(put(json!("bo"), None))
            .await
            .unwrap()
            .state
            .version,
        2
    );
    let got = ada
        .state_get(StateGetArgs {
            key: "plan/owner".into(),
            history: true,
        })
        .await
        .unwrap();
    assert_eq!(
        (got.version, got.value.clone(), got.by.as_deref()),
        (2, json!("bo"), Some("bo"))
    );
    assert_eq!(got.history.len(), 1);
    assert_eq!(got.history[0].value, json!("ada"));
    assert_eq!(ada.state_list().await.unwrap().keys.len(), 1);
    let never = ada
        .state_get(StateGetArgs {
            key: "none".into(),
            history: false,
        })
        .await
        .unwrap();
    assert_eq!((never.version, never.value), (0, json!(null)));
}

#[tokio::test]
async fn eight_writers_read_modify_write_without_losing_an_update() {
    let store = room(None).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let me = agent(&store, &format!("w{i}")).await;
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while done < 10 {
                let now = me
                    .state_get(StateGetArgs {
                        key: "n".into(),
                        history: false,
                    })
                    .await
                    .unwrap();
                let next = now.value.as_u64().unwrap_or(0) + 1;
                match me
                    .state_put(StatePutArgs {
                        key: "n".into(),
                        value: json!(next),
                        if_version: Some(now.version),
                    })
                    .await
                {
                    Ok(_) => done += 1,
                    Err(AgentError::StaleVersion { .. }) => tokio::task::yield_now().await,
                    Err(e) => panic!("{e}"),
                }
            }
            done
        }));
    }
    let mut puts = 0;
    for t in tasks {
        puts += t.await.unwrap();
    }
    let reader = agent(&store, "reader").await;
    let n = reader
        .state_get(StateGetArgs {
            key: "n".into(),
            history: false,
        })
        .await
        .unwrap();
    assert_eq!(n.value, json!(puts));
    assert_eq!(n.version, puts);
    assert_eq!(count(&store, Verb::StatePut).await as u64, puts);
}
