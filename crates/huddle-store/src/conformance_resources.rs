//! The conformance suite's resource leases (`Claims::acquire_resources`): the same
//! written behaviour on every backend, decided by the database in one transaction.

use std::collections::BTreeSet;
use std::time::Duration;

use huddle_core::resources::{Mode, ResourceName, Wanted};

use super::{wait_for_db_time, TestBackend};
use crate::resources::{live_holdings, ResourcesAcquired};
use crate::traits::{Epoch, Store};

fn want(name: &str, mode: Mode) -> Wanted {
    Wanted {
        name: ResourceName::parse(name).expect("a resource name"),
        mode,
    }
}

const TTL: Duration = Duration::from_secs(30);

async fn take(s: &dyn Store, holder: &str, wanted: &[Wanted], ttl: Duration) -> ResourcesAcquired {
    s.acquire_resources("r", holder, wanted, ttl)
        .await
        .expect("acquire_resources")
}

fn blockers(a: &ResourcesAcquired) -> BTreeSet<String> {
    match a {
        ResourcesAcquired::Won(h) => panic!("expected to be blocked, won {h:?}"),
        ResourcesAcquired::Blocked(b) => b.iter().map(|b| b.by.holder.clone()).collect(),
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Exclusive and shared holdings of overlapping globs: exclusive excludes everyone
/// whose glob can match a common path, shared admits shared, and the answer names
/// every holder in the way.
pub async fn resources_exclusive_and_shared_by_glob_overlap(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    assert!(take(&*s, "a", &[want("file:src/**", Mode::Exclusive)], TTL)
        .await
        .won());
    let blocked = take(&*other, "b", &[want("file:src/main.rs", Mode::Shared)], TTL).await;
    assert_eq!(blockers(&blocked), set(&["a"]));
    assert!(
        take(&*other, "b", &[want("file:docs/**", Mode::Shared)], TTL)
            .await
            .won()
    );
    assert!(take(&*s, "c", &[want("file:docs/a.md", Mode::Shared)], TTL)
        .await
        .won());
    // src/**/*.md overlaps a's src/**, so neither of e's two is taken; README.md
    // alone overlaps nothing held.
    let blocked = take(
        &*s,
        "e",
        &[
            want("file:src/**/*.md", Mode::Shared),
            want("file:README.md", Mode::Exclusive),
        ],
        TTL,
    )
    .await;
    assert_eq!(blockers(&blocked), set(&["a"]));
    assert!(
        take(&*s, "e", &[want("file:README.md", Mode::Exclusive)], TTL)
            .await
            .won()
    );
    let blocked = take(&*other, "d", &[want("file:**/*.md", Mode::Exclusive)], TTL).await;
    assert_eq!(blockers(&blocked), set(&["a", "b", "c", "e"]));
    // Other kinds match by name only, and kinds never meet.
    assert!(take(&*s, "a", &[want("api:github", Mode::Exclusive)], TTL)
        .await
        .won());
    assert!(
        take(&*other, "b", &[want("api:gitlab", Mode::Exclusive)], TTL)
            .await
            .won()
    );
    assert!(
        take(&*other, "b", &[want("slot:github", Mode::Exclusive)], TTL)
            .await
            .won()
    );
    let live = live_holdings(&*s, "r").await.expect("list");
    assert_eq!(live.len(), 7, "{live:?}");
}

/// Permits: never more holders than the least count any of them named; a release
/// frees a permit for the next.
pub async fn resources_permits_never_exceed_their_count(b: &impl TestBackend) {
    let s = b.store();
    let slot = |n| [want("slot:build", Mode::Permits(n))];
    let a = take(&*s, "a", &slot(2), TTL).await;
    assert!(take(&*s, "b", &slot(2), TTL).await.won());
    assert_eq!(
        blockers(&take(&*s, "c", &slot(2), TTL).await),
        set(&["a", "b"])
    );
    assert_eq!(
        blockers(&take(&*s, "c", &slot(3), TTL).await),
        set(&["a", "b"]),
        "a and b said 2"
    );
    assert_eq!(
        blockers(&take(&*s, "c", &[want("slot:build", Mode::Shared)], TTL).await),
        set(&["a", "b"])
    );
    let ResourcesAcquired::Won(a) = a else {
        panic!("a won")
    };
    assert!(s
        .release(&a[0].key, "a", a[0].epoch)
        .await
        .expect("release"));
    let c = take(&*s, "c", &slot(2), TTL).await;
    assert!(c.won());
    assert_eq!(
        blockers(&take(&*s, "d", &slot(1), TTL).await),
        set(&["b", "c"])
    );
}

/// A set is taken all or nothing: blocked on one resource, none is taken.
pub async fn resources_are_taken_all_or_nothing(b: &impl TestBackend) {
    let s = b.store();
    assert!(take(&*s, "a", &[want("api:x", Mode::Exclusive)], TTL)
        .await
        .won());
    let blocked = take(
        &*s,
        "b",
        &[
            want("api:y", Mode::Exclusive),
            want("api:x", Mode::Exclusive),
        ],
        TTL,
    )
    .await;
    assert_eq!(blockers(&blocked), set(&["a"]));
    assert!(
        take(&*s, "c", &[want("api:y", Mode::Exclusive)], TTL)
            .await
            .won(),
        "b took nothing"
    );
    // A won set comes back in the global order, one holding each.
    let ResourcesAcquired::Won(won) = take(
        &*s,
        "d",
        &[want("slot:z", Mode::Shared), want("api:w", Mode::Shared)],
        TTL,
    )
    .await
    else {
        panic!("free resources")
    };
    let names: Vec<&str> = won.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["api:w", "slot:z"]);
    assert!(won
        .iter()
        .all(|h| h.holder == "d" && h.epoch == Epoch::FIRST));
}

/// Expiry is the database clock's: a holding blocks until it lapses, then another
/// holder takes the resource; the lapsed holder taking it again gets a new epoch.
pub async fn resources_lapse_by_the_database_clock(b: &impl TestBackend) {
    let s = b.store();
    let other = b.reopen("second").await.expect("reopen");
    let ResourcesAcquired::Won(a) = take(
        &*s,
        "a",
        &[want("api:x", Mode::Exclusive)],
        Duration::from_millis(300),
    )
    .await
    else {
        panic!("free resource")
    };
    assert_eq!(
        blockers(&take(&*other, "b", &[want("api:x", Mode::Shared)], TTL).await),
        set(&["a"])
    );
    wait_for_db_time(&*s, a[0].expires_at).await;
    assert!(take(&*other, "b", &[want("api:x", Mode::Shared)], TTL)
        .await
        .won());
    assert!(
        s.renew(&a[0].key, "a", a[0].epoch, TTL)
            .await
            .expect("renew")
            .is_none(),
        "lapsed"
    );
    assert_eq!(
        blockers(&take(&*s, "a", &[want("api:x", Mode::Exclusive)], TTL).await),
        set(&["b"])
    );
    let ResourcesAcquired::Won(again) = take(&*s, "a", &[want("api:x", Mode::Shared)], TTL).await
    else {
        panic!("shared beside shared")
    };
    assert!(again[0].epoch > a[0].epoch || again[0].key != a[0].key);
}

/// The same holder taking a resource again keeps its epoch and extends it; taking it
/// in another mode replaces its holding.
pub async fn resources_retaken_keep_the_epoch_and_change_mode(b: &impl TestBackend) {
    let s = b.store();
    let ResourcesAcquired::Won(first) = take(&*s, "a", &[want("api:x", Mode::Shared)], TTL).await
    else {
        panic!("free")
    };
    let ResourcesAcquired::Won(again) = take(&*s, "a", &[want("api:x", Mode::Shared)], TTL).await
    else {
        panic!("own")
    };
    assert_eq!(again[0].epoch, first[0].epoch);
    assert!(again[0].expires_at >= first[0].expires_at);
    assert!(take(&*s, "b", &[want("api:x", Mode::Shared)], TTL)
        .await
        .won());
    // a's own shared holding does not block it, b's does.
    assert_eq!(
        blockers(&take(&*s, "a", &[want("api:x", Mode::Exclusive)], TTL).await),
        set(&["b"])
    );
    let b_live = live_holdings(&*s, "r").await.expect("list");
    let bh = b_live.iter().find(|h| h.holder == "b").expect("b holds");
    assert!(s.release(&bh.key, "b", bh.epoch).await.expect("release"));
    assert!(take(&*s, "a", &[want("api:x", Mode::Exclusive)], TTL)
        .await
        .won());
    let live = live_holdings(&*s, "r").await.expect("list");
    let modes: Vec<Mode> = live.iter().map(|h| h.mode).collect();
    assert_eq!(
        modes,
        [Mode::Exclusive],
        "the shared holding was given back: {live:?}"
    );
}

/// 16 contenders on several handles race for overlapping globs exclusively: exactly
/// one wins.
pub async fn resources_have_one_exclusive_winner_among_16(b: &impl TestBackend) {
    let other = b.reopen("second").await.expect("reopen");
    let globs = [
        "file:src/**",
        "file:src/*.rs",
        "file:**/main.rs",
        "file:src/main.rs",
    ];
    let start = std::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 { b.store() } else { other.clone() };
        let glob = globs[i % globs.len()];
        tasks.push(tokio::spawn(async move {
            super::spin_until(start);
            store
                .acquire_resources(
                    "r",
                    &format!("agent-{i}"),
                    &[want(glob, Mode::Exclusive)],
                    TTL,
                )
                .await
                .expect("acquire_resources")
        }));
    }
    let mut winners = 0;
    for t in tasks {
        winners += usize::from(t.await.expect("join").won());
    }
    assert_eq!(winners, 1);
}

/// Bad requests are refused before anything is decided.
pub async fn resources_bad_requests_are_refused(b: &impl TestBackend) {
    let s = b.store();
    assert!(s.acquire_resources("r", "a", &[], TTL).await.is_err());
    let twice = [want("api:x", Mode::Shared), want("api:x", Mode::Exclusive)];
    assert!(s.acquire_resources("r", "a", &twice, TTL).await.is_err());
    let one = [want("api:x", Mode::Shared)];
    assert!(s.acquire_resources("r/x", "a", &one, TTL).await.is_err());
    assert!(s.acquire_resources("r", "a/b", &one, TTL).await.is_err());
    assert!(live_holdings(&*s, "r").await.expect("list").is_empty());
}

/// A `state.put` row for version `version` of `key` with its own idempotency key.
fn put(actor: &str, key: &str, version: u64, value: i64) -> huddle_core::NewInteraction {
    huddle_core::NewInteraction::new(
        "r",
        huddle_core::Verb::StatePut,
        actor,
        huddle_core::Role::Agent,
        serde_json::json!({"key": key, "version": version, "value": value}),
    )
    .with_idempotency_key(huddle_core::shared_state::state_idempotency_key(
        "r", version, key,
    ))
}

/// Versions of shared state are decided by the database: one row per version (the
/// unique idempotency key answers a second writer with the first row's id), a put
/// must carry its version's key, and a version needs its predecessor.
pub async fn state_versions_are_decided_by_the_database(b: &impl TestBackend) {
    let s = b.store();
    let first = put("a", "k", 1, 10);
    let out = s.append(vec![first.clone()]).await.expect("v1");
    assert!(out[0].inserted);
    let rival = s
        .append(vec![put("b", "k", 1, 11)])
        .await
        .expect("stale v1");
    assert!(!rival[0].inserted, "a second version 1 is refused");
    assert_eq!(rival[0].id, first.id(), "and answered with the first");
    assert!(
        s.append(vec![put("a", "k", 3, 30)]).await.is_err(),
        "no version 2 yet"
    );
    let mut unkeyed = put("a", "k", 2, 20);
    unkeyed.idempotency_key = None;
    assert!(
        s.append(vec![unkeyed]).await.is_err(),
        "a put carries its key"
    );
    let mut wrong = put("a", "k", 2, 20);
    wrong.idempotency_key = Some("state/r/7/k".into());
    assert!(
        s.append(vec![wrong]).await.is_err(),
        "its own version's key"
    );
    // Versions 2 and 3 in one batch: the predecessor may come earlier in it.
    let out = s
        .append(vec![put("a", "k", 2, 20), put("a", "k", 3, 30)])
        .await
        .expect("v2 and v3");
    assert!(out.iter().all(|a| a.inserted));
    // Eight writers race for version 4 on several handles: one row lands.
    let other = b.reopen("second").await.expect("reopen");
    let start = std::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = if i % 2 == 0 { b.store() } else { other.clone() };
        tasks.push(tokio::spawn(async move {
            super::spin_until(start);
            store
                .append(vec![put(&format!("w{i}"), "k", 4, i)])
                .await
                .expect("append")[0]
                .inserted
        }));
    }
    let mut landed = 0;
    for t in tasks {
        landed += usize::from(t.await.expect("join"));
    }
    assert_eq!(landed, 1);
}
