//! Conversation semantics end to end (plan 0026), through real relays and exec agents
//! that log every execution, on both backends: a message naming several agents gets
//! exactly one reply from each (also with one of them hosted on two relays); a
//! broadcast gets one reply in all; `huddle post --reply-to` wakes the parent's author
//! only, and nobody when the parent is a person's message.

use crate::common;

use std::collections::BTreeMap;

use common::relays::*;
use huddle_core::protocol::{Subject, TurnFailedBody};
use huddle_core::tasks::TaskStatus;
use huddle_core::{InteractionId, NewInteraction, Role, Verb};

on_both_backends!(
    each_named_agent_replies_once_and_reply_to_wakes_the_author,
    a_group_mention_is_answered_by_each_member_or_by_one,
    progress_notes_are_shown_but_never_count_as_the_reply,
    a_prompt_carries_the_thread_since_the_agent_last_spoke,
    the_owners_stop_ends_a_long_turn_and_the_task_is_offered_again,
    a_watched_thread_goes_to_its_watcher
);

/// Executions per (agent, question tag) in the agents' log.
fn executions(log: &std::path::Path) -> BTreeMap<(String, String), usize> {
    let mut n = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        if let Some((agent, tag)) = line.split_once(' ') {
            *n.entry((agent.to_string(), tag.to_string())).or_default() += 1;
        }
    }
    n
}

/// An exec agent that logs "<agent> <tag>" for the last `[<letter>n]` tag in its
/// prompt (the message comes last) and answers "<agent> did <tag>" with trailing
/// white space that huddle trims. Returns the script and its log.
fn tagging_agent(h: &Huddle, letter: char) -> (std::path::PathBuf, std::path::PathBuf) {
    let log = h.dir().join("executions.log");
    let agent = h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\ntag=$(printf '%s' \"$p\" | grep -o '\\[{letter}[0-9]*\\]' | tail -n 1)\n\
             echo \"$HUDDLE_AGENT $tag\" >> {log}\nprintf '%s did %s\\n\\n' \"$HUDDLE_AGENT\" \"$tag\"",
            log = log.display()
        ),
    );
    (agent, log)
}

/// Waits until `id` has replies from exactly `who` (sorted) and returns them by agent.
async fn replies_from(
    h: &mut Huddle,
    id: InteractionId,
    who: &[&str],
) -> BTreeMap<String, InteractionId> {
    let want: Vec<String> = who.iter().map(|s| s.to_string()).collect();
    h.wait_until(&format!("replies from {who:?}"), secs(60), |l| {
        let mut got: Vec<String> = l.replies_to(id).iter().map(|r| r.actor.clone()).collect();
        got.sort();
        got == want
    })
    .await;
    h.ledger
        .replies_to(id)
        .iter()
        .map(|r| (r.actor.clone(), r.id))
        .collect()
}

/// `huddle post --as AS --reply-to TO TEXT`; returns what it prints (the new id).
fn reply_from_cli(h: &Huddle, actor: &str, to: &str, text: &str) -> String {
    let mut c = common::huddle(&h.db.url);
    c.args([
        "post",
        "--room",
        &h.room,
        "--as",
        actor,
        "--reply-to",
        to,
        text,
    ]);
    common::ok(c)
}

async fn each_named_agent_replies_once_and_reply_to_wakes_the_author(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let (agent, log) = tagging_agent(&h, 'Q');
    // cid is hosted by both relays: it must still answer each message once.
    h.spawn_relay(
        "r0",
        vec![
            AgentSpec::exec("ann", &agent),
            AgentSpec::exec("cid", &agent),
        ],
    );
    h.spawn_relay(
        "r1",
        vec![
            AgentSpec::exec("cid", &agent),
            AgentSpec::exec("dee", &agent),
        ],
    );
    h.wait_registered(&["ann", "cid", "dee"]).await;

    // Two and three named agents: one reply from each.
    let q1 = h
        .post(
            "hank",
            Role::Human,
            "[Q1] @ann and @cid: each take your part",
        )
        .await;
    let q1_replies = replies_from(&mut h, q1, &["ann", "cid"]).await;
    let q2 = h
        .post("hank", Role::Human, "[Q2] @ann @cid @dee: report")
        .await;
    replies_from(&mut h, q2, &["ann", "cid", "dee"]).await;
    // A broadcast: one reply in all.
    let q3 = h.post("hank", Role::Human, "[Q3] anyone?").await;
    h.wait_until("a reply to Q3", secs(60), |l| !l.replies_to(q3).is_empty())
        .await;

    // Reply-to from the CLI, by a unique id prefix: only ann, the parent's author.
    let ann_reply = q1_replies["ann"].to_string();
    let q4 = reply_from_cli(&h, "hank", &ann_reply[..10], "[Q4] thanks, one more thing");
    let q4: InteractionId = q4.trim().parse().expect("post prints the id");
    let parent = h
        .wait_for("Q4 in the ledger", secs(30), |l| {
            l.get(q4).map(|r| r.parent)
        })
        .await;
    assert_eq!(
        parent,
        Some(q1_replies["ann"]),
        "--reply-to sets the parent"
    );
    replies_from(&mut h, q4, &["ann"]).await;
    // A reply to a person's own message wakes nobody; the broadcast after it shows
    // the relays read past it.
    reply_from_cli(&h, "ivy", &q3.to_string(), "[Q5] I agree with hank");
    let q6 = h.post("hank", Role::Human, "[Q6] last call").await;
    h.wait_until("a reply to Q6", secs(60), |l| !l.replies_to(q6).is_empty())
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;

    // Count executions, not rows.
    let ran = executions(&log);
    let count = |tag: &str| -> BTreeMap<String, usize> {
        ran.iter()
            .filter(|((_, t), _)| t == tag)
            .map(|((a, _), n)| (a.clone(), *n))
            .collect()
    };
    let each = |agents: &[&str]| -> BTreeMap<String, usize> {
        agents.iter().map(|a| (a.to_string(), 1)).collect()
    };
    assert_eq!(count("[Q1]"), each(&["ann", "cid"]), "{ran:?}");
    assert_eq!(count("[Q2]"), each(&["ann", "cid", "dee"]), "{ran:?}");
    assert_eq!(count("[Q3]").values().sum::<usize>(), 1, "{ran:?}");
    assert_eq!(count("[Q4]"), each(&["ann"]), "{ran:?}");
    assert!(
        count("[Q5]").is_empty(),
        "a reply to a person woke an agent: {ran:?}"
    );
    assert_eq!(count("[Q6]").values().sum::<usize>(), 1, "{ran:?}");
    // Replies are written without the agents' trailing white space.
    let l = &h.ledger;
    for r in l.replies_to(q2) {
        let text = r.body["text"].as_str().unwrap_or_default();
        assert_eq!(text, format!("{} did [Q2]", r.actor));
    }
}

/// `!stop @agent`: the agent's long task turn ends within a bound (its process is
/// killed), nothing is completed under it, its `turn.failed` says the owner stopped
/// it, and the task is offered again and completed once.
async fn the_owners_stop_ends_a_long_turn_and_the_task_is_offered_again(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("executions.log");
    let first = h.dir().join("first-run");
    // The first execution of the task hangs (until killed); later ones finish at once.
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\necho \"start $HUDDLE_AGENT $HUDDLE_TASK\" >> {log}\n\
             if mkdir {first} 2>/dev/null; then sleep 120; fi\n\
             echo \"end $HUDDLE_AGENT $HUDDLE_TASK\" >> {log}\necho done",
            log = log.display(),
            first = first.display()
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &agent)]);
    h.wait_registered(&["ada"]).await;
    h.delegate("long: a long job").await;
    let hung = h
        .wait_for("the first execution to start", secs(30), |l| {
            l.task("long")
                .filter(|t| t.status == TaskStatus::Claimed)
                .and_then(|t| t.owner.clone())
        })
        .await;
    assert_eq!(hung, "ada");
    let deadline = std::time::Instant::now() + secs(30);
    while std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count()
        < 1
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never started"
        );
        tokio::time::sleep(ms(20)).await;
    }

    let asked = std::time::Instant::now();
    let reply = h.owner_says("!stop @ada").await;
    assert!(reply.starts_with("Stopping ada's running turns"), "{reply}");
    let subject = Subject::task("long", None);
    let reason = h
        .wait_for("the stopped turn's turn.failed", secs(20), |l| {
            l.about(Verb::TurnFailed, &subject).first().map(|r| {
                serde_json::from_value::<TurnFailedBody>(r.body.clone())
                    .map(|b| b.reason)
                    .unwrap_or_default()
            })
        })
        .await;
    assert!(reason.contains("stopped by the owner"), "{reason}");
    assert!(
        asked.elapsed() < secs(20),
        "the stop took {:?}",
        asked.elapsed()
    );
    // Offered again (ada is the only agent: it takes it after the back-off window)
    // and completed once, by the second execution.
    h.wait_until("the task done", secs(60), |l| {
        l.task("long").is_some_and(|t| t.status == TaskStatus::Done)
    })
    .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    h.ledger.assert_all_done_exactly_once(1);
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    let starts = lines.lines().filter(|l| l.starts_with("start ")).count();
    let ends = lines.lines().filter(|l| l.starts_with("end ")).count();
    assert_eq!(
        (starts, ends),
        (2, 1),
        "the stopped execution never finished; one more ran to the end:\n{lines}"
    );
    let t = h.ledger.task("long").expect("the task");
    assert_eq!(t.attempts, 2, "the stopped attempt counts");
}

/// `!watch @cy t1`: broadcasts in thread t1 are answered by cy (the others wait a
/// responder window). Other threads and `!unwatch` are covered by the core tests.
async fn a_watched_thread_goes_to_its_watcher(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let (agent, log) = tagging_agent(&h, 'W');
    h.spawn_relay("r0", vec![AgentSpec::exec("bo", &agent)]);
    h.spawn_relay("r1", vec![AgentSpec::exec("cy", &agent)]);
    h.wait_registered(&["bo", "cy"]).await;
    let reply = h.owner_says("!watch @cy t1").await;
    assert!(reply.contains("cy now follows thread t1"), "{reply}");
    let in_thread = |text: &str| {
        NewInteraction::new(
            h.room.as_str(),
            Verb::MessagePosted,
            "hank",
            Role::Human,
            serde_json::json!({ "text": text }),
        )
        .in_thread("t1")
    };
    let mut asked = Vec::new();
    for i in 0..3 {
        let row = in_thread(&format!("[W{i}] anyone on this?"));
        asked.push(h.store.append(vec![row]).await.expect("post")[0].id);
    }
    for id in &asked {
        let who = h
            .wait_for("a reply in t1", secs(60), |l| {
                l.replies_to(*id).first().map(|r| r.actor.clone())
            })
            .await;
        assert_eq!(who, "cy", "the watcher answers in its thread");
    }
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let ran = executions(&log);
    for i in 0..3 {
        let tag = format!("[W{i}]");
        let by: Vec<&String> = ran
            .keys()
            .filter(|(_, t)| *t == tag)
            .map(|(a, _)| a)
            .collect();
        assert_eq!(by, vec!["cy"], "{tag}: {ran:?}");
        assert_eq!(ran[&("cy".to_string(), tag)], 1);
    }
}

/// `@@review` under `group-reply each` (the default) is answered once by every
/// member; after `!config group-reply one` a group-only message is answered once in
/// all, by one member, while a message that also names an agent is still answered by
/// each named agent. Counted by executions.
async fn a_group_mention_is_answered_by_each_member_or_by_one(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let (agent, log) = tagging_agent(&h, 'G');
    let reviewer = |key: &str| AgentSpec {
        capabilities: vec!["review".into()],
        ..AgentSpec::exec(key, &agent)
    };
    h.spawn_relay("r0", vec![reviewer("ann"), AgentSpec::exec("dee", &agent)]);
    h.spawn_relay("r1", vec![reviewer("cid")]);
    h.wait_registered(&["ann", "cid", "dee"]).await;

    let g1 = h
        .post("hank", Role::Human, "[G1] @@review please look")
        .await;
    replies_from(&mut h, g1, &["ann", "cid"]).await;

    let reply = h.config("group-reply one").await;
    assert!(reply.contains("group-reply"), "{reply}");
    let get = h.owner_says("!config get group-reply").await;
    assert!(get.contains("one"), "{get}");
    let g2 = h
        .post("hank", Role::Human, "[G2] @@review once for the group")
        .await;
    h.wait_until("a reply to G2", secs(60), |l| !l.replies_to(g2).is_empty())
        .await;
    let g3 = h.post("hank", Role::Human, "[G3] @@review and @dee").await;
    replies_from(&mut h, g3, &["ann", "cid", "dee"]).await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;

    let ran = executions(&log);
    let by = |tag: &str| -> Vec<(String, usize)> {
        ran.iter()
            .filter(|((_, t), _)| t == tag)
            .map(|((a, _), n)| (a.clone(), *n))
            .collect()
    };
    assert_eq!(
        by("[G1]"),
        vec![("ann".to_string(), 1), ("cid".to_string(), 1)],
        "{ran:?}"
    );
    let g2_runs = by("[G2]");
    assert_eq!(
        g2_runs.len(),
        1,
        "one member answers for the group: {ran:?}"
    );
    assert_eq!(g2_runs[0].1, 1, "{ran:?}");
    assert!(["ann", "cid"].contains(&g2_runs[0].0.as_str()), "{ran:?}");
    assert_eq!(h.ledger.replies_to(g2).len(), 1);
    assert_eq!(by("[G3]").len(), 3, "{ran:?}");
    assert!(by("[G3]").iter().all(|(_, n)| *n == 1), "{ran:?}");
}

/// An exec agent reports progress on standard error while it works: each note is a
/// `turn.progress` row under the turn (parent = the message), shown by `huddle tail`
/// and on the board, and the message still gets exactly one reply from one
/// execution.
async fn progress_notes_are_shown_but_never_count_as_the_reply(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let log = h.dir().join("executions.log");
    let go = h.dir().join("go");
    let agent = h.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\necho \"$HUDDLE_AGENT\" >> {log}\n\
             echo 'huddle-progress: reading the logs' >&2\n\
             echo 'huddle-progress: half way' >&2\n\
             echo 'something else' >&2\n\
             i=0; while [ ! -e {go} ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done\n\
             echo 'the answer is 42'",
            log = log.display(),
            go = go.display()
        ),
    );
    h.spawn_relay("r0", vec![AgentSpec::exec("ann", &agent)]);
    h.wait_registered(&["ann"]).await;
    let q = h
        .post("hank", Role::Human, "@ann what is the answer?")
        .await;
    // While the turn runs, the board shows ann working with its latest note.
    h.wait_until("both notes written", secs(30), |l| {
        l.of_verb(Verb::TurnProgress).count() == 2
    })
    .await;
    let mut board = common::huddle(&h.db.url);
    board.args(["board", "--room", &h.room, "--json"]);
    let board: serde_json::Value =
        serde_json::from_str(&common::ok(board)).expect("board --json is JSON");
    let ann = board["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["agent"] == "ann"))
        .cloned()
        .expect("ann on the board");
    assert_eq!(ann["state"], "working", "{ann}");
    assert_eq!(ann["note"], "half way", "{ann}");
    assert!(
        h.ledger.replies_to(q).is_empty(),
        "no reply before the turn ends"
    );
    std::fs::write(&go, "").expect("let the agent finish");
    h.wait_until("ann's reply", secs(60), |l| !l.replies_to(q).is_empty())
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;

    let l = &h.ledger;
    let notes: Vec<String> = l
        .of_verb(Verb::TurnProgress)
        .map(|(_, r)| {
            assert_eq!(
                r.parent,
                Some(q),
                "a note belongs to the message it is about"
            );
            assert_eq!(r.actor, "ann");
            r.body["text"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(notes, vec!["reading the logs", "half way"]);
    let replies = l.replies_to(q);
    assert_eq!(replies.len(), 1, "the notes are not replies");
    assert_eq!(replies[0].body["text"], "the answer is 42");
    assert_eq!(l.turns_replied_to(q).len(), 1);
    let runs = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(runs.lines().count(), 1, "one execution: {runs}");

    let mut tail = common::huddle(&h.db.url);
    tail.args(["tail", "--room", &h.room]);
    let tail = common::ok(tail);
    assert!(
        tail.contains("(progress, not the reply) half way"),
        "tail shows the notes: {tail}"
    );
}

/// The `<thread>` block: in thread t1, bo answers two questions and ann is asked the
/// third; ann's prompt holds the first two questions and bo's answers, oldest first,
/// and bo's prompt for the second question holds only what came after bo last spoke
/// (not the first question). With `thread-context 0` the block is left out.
async fn a_prompt_carries_the_thread_since_the_agent_last_spoke(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let prompts = h.dir().join("prompts");
    std::fs::create_dir_all(&prompts).expect("prompts dir");
    let agent = h.script(
        "agent.sh",
        &format!(
            "p=$(cat)\ntag=$(printf '%s' \"$p\" | grep -o '\\[T[0-9]*\\]' | tail -n 1 | tr -d '[]')\n\
             printf '%s' \"$p\" > {dir}/$HUDDLE_AGENT-$tag\necho \"$HUDDLE_AGENT on $tag\"",
            dir = prompts.display()
        ),
    );
    h.spawn_relay(
        "r0",
        vec![
            AgentSpec::exec("ann", &agent),
            AgentSpec::exec("bo", &agent),
        ],
    );
    h.wait_registered(&["ann", "bo"]).await;
    let in_t1 = |h: &Huddle, text: &str| {
        NewInteraction::new(
            h.room.as_str(),
            Verb::MessagePosted,
            "hank",
            Role::Human,
            serde_json::json!({ "text": text }),
        )
        .in_thread("t1")
    };
    let mut first = None;
    for (tag, to) in [("T1", "bo"), ("T2", "bo"), ("T3", "ann")] {
        let row = in_t1(&h, &format!("@{to} [{tag}] point {tag}"));
        let id = h.store.append(vec![row]).await.expect("post")[0].id;
        h.wait_until("the answer", secs(60), |l| !l.replies_to(id).is_empty())
            .await;
        if first.is_none() {
            first = Some(id);
            // A person answering a person: no agent is woken, but it is said here.
            let mut aside = in_t1(&h, "an aside from ivy");
            aside.actor = "ivy".into();
            aside = aside.with_parent(id);
            h.store.append(vec![aside]).await.expect("post");
        }
    }
    h.config("thread-context 0").await;
    let row = in_t1(&h, "@ann [T4] and now?");
    let id = h.store.append(vec![row]).await.expect("post")[0].id;
    h.wait_until("the answer", secs(60), |l| !l.replies_to(id).is_empty())
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;

    let read = |name: &str| std::fs::read_to_string(prompts.join(name)).unwrap_or_default();
    let ann = read("ann-T3");
    let block = ann
        .split("<thread")
        .nth(1)
        .and_then(|b| b.split("</thread>").next())
        .unwrap_or_else(|| panic!("ann's prompt has a <thread> block:\n{ann}"));
    let order: Vec<usize> = [
        "[T1] point T1",
        "bo on T1",
        "an aside from ivy",
        "[T2] point T2",
        "bo on T2",
    ]
    .iter()
    .map(|s| block.find(s).unwrap_or_else(|| panic!("{s:?} in {block}")))
    .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {block}"
    );
    assert!(
        !block.contains("[T3]"),
        "the message answered is not repeated: {block}"
    );
    let bo = read("bo-T2");
    assert!(bo.contains("an aside from ivy"), "{bo}");
    assert!(
        !bo.contains("[T1]"),
        "bo spoke after T1: only what came since: {bo}"
    );
    let ann4 = read("ann-T4");
    assert!(ann4.contains("[T4]") && !ann4.contains("<thread"), "{ann4}");
}
