//! Sagas (plan 0056), end to end through the real binary: a chain whose last step
//! fails for good, and a chain the owner cancels, each run its completed steps'
//! compensations in reverse order, each exactly once, counted from the agents' own log.

use crate::common;

use common::relays::*;
use huddle_core::tasks::TaskStatus;

on_both_backends!(failed_and_cancelled_chains_are_compensated_in_reverse_once);

async fn failed_and_cancelled_chains_are_compensated_in_reverse_once(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("runs.log");
    // Every execution is a line; a compensation checks that its prompt names what it
    // undoes; `ship` always fails.
    let agent = h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\necho \"run $HUDDLE_TASK\" >> '{log}'\n\
             case \"$HUDDLE_TASK\" in\n\
               *--undo) case \"$p\" in *'<compensates id=\"'*) ;; *) echo 'no compensates' >&2; exit 3;; esac ;;\n\
               ship) echo 'the carrier is down' >&2; exit 1 ;;\n\
             esac\necho \"ok $HUDDLE_TASK\" >> '{log}'\necho \"done $HUDDLE_TASK\"",
            log = log.display()
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("bo", &agent)]);
    h.wait_registered(&["ada", "bo"]).await;
    h.delegate(
        "reserve: reserve the seats [undo release the seats]\n\
         charge: charge the card [after reserve] [undo refund the card]\n\
         ship: send the tickets [after charge] [attempts 1]\n\
         book: book the room [undo unbook the room]\n\
         pay: pay the deposit [after book] [undo refund the deposit]\n\
         confirm: confirm with the guest [after pay] [needs telephone]",
    )
    .await;
    h.wait_until("the first chain compensated", secs(90), |l| {
        ["charge--undo", "reserve--undo"]
            .iter()
            .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Done))
            && l.task("pay").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    // Nobody can take `confirm`: the owner cancels it, and its chain is undone.
    let reply = h.owner_says("!cancel confirm").await;
    assert!(reply.contains("confirm"), "{reply}");
    h.wait_until("the second chain compensated", secs(60), |l| {
        ["pay--undo", "book--undo"]
            .iter()
            .all(|t| l.task(t).is_some_and(|t| t.status == TaskStatus::Done))
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    let listing = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["tasks", "--room", "lobby"]);
        c
    });
    assert!(
        listing.contains("charge--undo") && listing.contains("(compensates charge)"),
        "{listing}"
    );
    let traced = common::ok({
        let mut c = common::huddle(&h.db.url);
        c.args(["trace", "--room", "lobby", "reserve--undo"]);
        c
    });
    assert!(
        traced.contains("compensated by reserve--undo:") && traced.contains("task reserve:"),
        "{traced}"
    );
    h.stop_all().await;

    let text = std::fs::read_to_string(&log).expect("the agents' log");
    let runs: Vec<&str> = text.lines().filter(|l| l.starts_with("run ")).collect();
    let count = |t: &str| runs.iter().filter(|l| **l == format!("run {t}")).count();
    for t in [
        "reserve",
        "charge",
        "ship",
        "charge--undo",
        "reserve--undo",
        "book",
        "pay",
        "pay--undo",
        "book--undo",
    ] {
        assert_eq!(count(t), 1, "{t} ran once:\n{text}");
    }
    assert_eq!(runs.len(), 9, "nothing else ran:\n{text}");
    assert!(
        !text.contains("run ship--undo"),
        "a failed step is not undone"
    );
    let at = |t: &str| runs.iter().position(|l| *l == format!("run {t}"));
    assert!(
        at("charge--undo") < at("reserve--undo"),
        "reverse order:\n{text}"
    );
    assert!(at("pay--undo") < at("book--undo"), "reverse order:\n{text}");
    assert!(
        at("ship") < at("charge--undo"),
        "after the failure:\n{text}"
    );
    assert!(
        text.lines().filter(|l| l.starts_with("ok ")).count() == 8,
        "every compensation checked its prompt:\n{text}"
    );
}
