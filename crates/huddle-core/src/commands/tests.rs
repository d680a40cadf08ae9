//! Tests of both owner commands through their public seams.

use super::*;
use crate::commands::OwnerAuthority;
use crate::config::{ConfigKey, ConfigValue};
use crate::fold::Fold;
use crate::model::{NewInteraction, Position, Timestamp};
use crate::signing::{OwnerSecret, SignatureError, SIGNATURE_FIELD};
use crate::testing::ledger_row as row;
use crate::testing::{created_with_key, materialize, owner_secret, signed_post};
use proptest::prelude::*;
use serde_json::json;

// ---- helpers ----------------------------------------------------------------

/// The accepted plan as `(id, label, deps, assignee)`.
fn plan(text: &str) -> Vec<(String, String, Vec<String>, Option<String>)> {
    match parse_delegate(text) {
        Ok(p) => p
            .tasks
            .into_iter()
            .map(|t| (t.id, t.label, t.deps, t.assignee))
            .collect(),
        Err(e) => panic!("rejected:\n{e}"),
    }
}

fn t(
    id: &str,
    label: &str,
    deps: &[&str],
    who: Option<&str>,
) -> (String, String, Vec<String>, Option<String>) {
    (
        id.into(),
        label.into(),
        deps.iter().map(|d| d.to_string()).collect(),
        who.map(str::to_string),
    )
}

/// The first error of a rejected `!delegate`: its line and full message.
fn reject(text: &str) -> (Option<usize>, String) {
    let e = parse_delegate(text).expect_err("must be rejected");
    let first = e.first().expect("at least one error");
    (first.line, first.to_string())
}

fn config(text: &str) -> ConfigCommand {
    match parse_config(text) {
        Ok(c) => c,
        Err(e) => panic!("rejected: {e}"),
    }
}

fn config_err(text: &str) -> String {
    CommandError::from(parse_config(text).expect_err("must be rejected")).to_string()
}

// ---- !delegate: accepted ------------------------------------------------------

#[test]
fn delegate_reads_labels_deps_and_assignees() {
    let text = "!delegate\n\
                spec: write the spec\n\
                api: build the API [after spec] @ana\n\
                ui: build the UI @bo [after spec]\n\
                ship: ship it [after api, ui]";
    assert_eq!(
        plan(text),
        vec![
            t("spec", "write the spec", &[], None),
            t("api", "build the API", &["spec"], Some("ana")),
            t("ui", "build the UI", &["spec"], Some("bo")),
            t("ship", "ship it", &["api", "ui"], None),
        ]
    );
}

#[test]
fn a_label_that_ends_in_after_is_only_a_label() {
    assert_eq!(
        plan("!delegate\na: clean up after\nb: tidy after a\nc: see [afterword] [after a]"),
        vec![
            t("a", "clean up after", &[], None),
            t("b", "tidy after a", &[], None),
            t("c", "see [afterword]", &["a"], None),
        ]
    );
    // Brackets that are not an after clause stay in the label.
    assert_eq!(
        plan("x: fix it [WIP]"),
        vec![t("x", "fix it [WIP]", &[], None)]
    );
}

/// The accepted plan's annotations as `(id, needs, priority, size, attempts, path)`.
type Notes = (
    String,
    Vec<String>,
    Option<u32>,
    Option<u32>,
    Option<u32>,
    u64,
);

fn notes(text: &str) -> Vec<Notes> {
    match parse_delegate(text) {
        Ok(p) => p
            .tasks
            .into_iter()
            .map(|t| (t.id, t.needs, t.priority, t.size, t.attempts, t.path))
            .collect(),
        Err(e) => panic!("rejected:\n{e}"),
    }
}

#[test]
fn delegate_reads_annotations_in_any_order_with_or_without_colons() {
    let text = "!delegate\n\
                a: fetch data [needs: sql, rust,sql] [priority 5] @ana\n\
                b: crunch [SIZE: 10] [after a] [Attempts 1]\n\
                c: report [after b] @bo [needs rust]\n\
                d: free [WIP] [priority:0]";
    let caps = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        notes(text),
        vec![
            ("a".into(), caps(&["rust", "sql"]), Some(5), None, None, 12),
            ("b".into(), caps(&[]), None, Some(10), Some(1), 11),
            ("c".into(), caps(&["rust"]), None, None, None, 1),
            ("d".into(), caps(&[]), Some(0), None, None, 1),
        ]
    );
    assert_eq!(
        plan(text),
        vec![
            t("a", "fetch data", &[], Some("ana")),
            t("b", "crunch", &["a"], None),
            t("c", "report", &["b"], Some("bo")),
            t("d", "free [WIP]", &[], None),
        ]
    );
}

#[test]
fn critical_paths_take_the_longest_chain_of_sizes() {
    // a -> b (size 5) -> d, and a -> c -> d: a's path goes through b.
    let text = "!delegate\nd: last [after b, c]\nb: big [after a] [size 5]\n\
                c: small [after a]\na: first [size 2]\ne: alone [size 3]";
    let paths: Vec<(String, u64)> = notes(text).into_iter().map(|n| (n.0, n.5)).collect();
    assert_eq!(
        paths,
        [("a", 8), ("b", 6), ("c", 2), ("d", 1), ("e", 3)]
            .map(|(id, p)| (id.to_string(), p))
            .to_vec()
    );
}

#[test]
fn annotations_become_fields_of_task_created() {
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    let text =
        "!delegate\na: one [needs rust] [priority 3] [size 4]\nb: two [after a] [attempts 7] [due 1h30m]";
    let command = signed_post(2, "lobby", None, "olga", text, &key);
    auth.apply(&command);
    let Some(Ok(parsed)) = owner_command_in(&command, auth.config(), &ParseContext::default())
    else {
        panic!("the signed command parses");
    };
    let rows = derived_rows(&command, &parsed, auth.config());
    let bodies: Vec<crate::protocol::task::TaskCreatedBody> = rows
        .iter()
        .map(|r| crate::protocol::task::TaskCreatedBody::parse(&r.body).expect("a body"))
        .collect();
    assert_eq!(bodies[0].needs, ["rust"]);
    assert_eq!(
        (
            bodies[0].priority,
            bodies[0].size,
            bodies[0].path,
            bodies[0].max_attempts
        ),
        (Some(3), Some(4), Some(5), Some(3))
    );
    // No dependants in the plan: no path written; the room's max-attempts unless the
    // line says otherwise.
    assert_eq!(
        (
            bodies[1].priority,
            bodies[1].size,
            bodies[1].path,
            bodies[1].max_attempts
        ),
        (None, None, None, Some(7))
    );
    assert_eq!(
        (bodies[0].due_ms, bodies[1].due_ms),
        (None, Some(5_400_000))
    );
}

#[test]
fn review_clauses_name_a_reviewer_and_rounds_from_the_line_or_the_room() {
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    let config = signed_post(2, "lobby", None, "olga", "!config review-rounds 5", &key);
    auth.apply(&config);
    let Some(Ok(parsed)) = owner_command_in(&config, auth.config(), &ParseContext::default())
    else {
        panic!("the config command parses");
    };
    for row in derived_rows(&config, &parsed, auth.config()) {
        auth.apply(&materialize(row, Position::new(0, 3), Timestamp(3)));
    }
    let text = "!delegate
a: one [review @lead]
b: two [after a] [review: cy rounds 2] @bo
c: three";
    let command = signed_post(4, "lobby", None, "olga", text, &key);
    auth.apply(&command);
    let Some(Ok(parsed)) = owner_command_in(&command, auth.config(), &ParseContext::default())
    else {
        panic!("the signed command parses");
    };
    let bodies: Vec<crate::protocol::task::TaskCreatedBody> =
        derived_rows(&command, &parsed, auth.config())
            .iter()
            .map(|r| crate::protocol::task::TaskCreatedBody::parse(&r.body).expect("a body"))
            .collect();
    let review = |b: &crate::protocol::task::TaskCreatedBody| {
        b.review.as_ref().map(|r| (r.agent.clone(), r.rounds))
    };
    assert_eq!(
        review(&bodies[0]),
        Some(("lead".to_string(), 5)),
        "the room's rounds"
    );
    assert_eq!(
        review(&bodies[1]),
        Some(("cy".to_string(), 2)),
        "the line's rounds"
    );
    assert_eq!(bodies[1].assignee.as_deref(), Some("bo"));
    assert_eq!(review(&bodies[2]), None);
    // Errors name the line and say what to write.
    for (text, want) in [
        ("a: x [review]", "names no reviewer"),
        (
            "a: x [review @lead rounds 0]",
            "rounds is a whole number from 1 to 20",
        ),
        (
            "a: x [review @lead rounds 21]",
            "rounds is a whole number from 1 to 20",
        ),
        ("a: x [review @lead @cy]", "one reviewer per task"),
        ("a: x [review @lead rounds 2 3]", "unexpected `3`"),
        ("a: x [review @le/ad]", "bad reviewer"),
        ("a: x [review @lead] [review @cy]", "only once"),
        ("a: x [review @lead] more label", "must come at the end"),
    ] {
        let e = parse_delegate(text).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains(want), "{text}: {e}");
    }
}

#[test]
fn undo_clauses_name_a_compensation_and_its_ids_are_reserved() {
    let plan = parse_delegate(
        "!delegate\nreserve: reserve seats [undo release the seats]\n\
         charge: charge the card [after reserve] [undo: refund the card] @bo",
    )
    .expect("parses");
    let undo: Vec<Option<&str>> = plan.tasks.iter().map(|t| t.undo.as_deref()).collect();
    assert_eq!(undo, [Some("release the seats"), Some("refund the card")]);
    assert_eq!(plan.tasks[1].assignee.as_deref(), Some("bo"));
    for (text, want) in [
        ("a: x [undo]", "say what undoes the task"),
        ("a: x [undo  ]", "say what undoes the task"),
        ("a--undo: x", "ids ending in `--undo` are the compensations"),
        ("a: x [undo one] [undo two]", "only once"),
    ] {
        let e = parse_delegate(text).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains(want), "{text}: {e}");
    }
}

#[test]
fn delegate_orders_dependencies_first_then_by_line() {
    let text = "!delegate\nc: third [after b]\nb: second [after a]\na: first\nz: free";
    let ids: Vec<String> = plan(text).into_iter().map(|t| t.0).collect();
    assert_eq!(ids, ["a", "b", "c", "z"]);
    let lines: Vec<usize> = parse_delegate(text)
        .unwrap()
        .tasks
        .iter()
        .map(|t| t.line)
        .collect();
    assert_eq!(lines, [4, 3, 2, 5]);
}

#[test]
fn delegate_accepts_bullets_comments_crlf_inline_and_loose_dep_lists() {
    let text = "\n  !delegate a: inline first\r\n# a comment\r\n\r\n- b: bullet [AFTER a,a , a]\n* c: star [after a b]\n";
    assert_eq!(
        plan(text),
        vec![
            t("a", "inline first", &[], None),
            t("b", "bullet", &["a"], None),
            t("c", "star", &["a", "b"], None),
        ]
    );
    assert_eq!(plan("a: x: y: z"), vec![t("a", "x: y: z", &[], None)]);
    let p = parse_delegate("a: one\nb: two").unwrap();
    assert_eq!(p.summary(), "Created 2 tasks: a, b.");
}

#[test]
fn delegate_may_wait_for_existing_tasks_but_not_reuse_their_ids() {
    let exists = |id: &str| id == "old";
    let p = parse_delegate_with("!delegate\nnew: after the old one [after old]", &exists).unwrap();
    assert_eq!(p.tasks[0].deps, vec!["old".to_string()]);
    let e = parse_delegate_with("!delegate\nold: again", &exists).unwrap_err();
    assert_eq!(
        e.errors[0].to_string(),
        "line 2: task id `old` already exists in this room; choose another id"
    );
}

// ---- !delegate: every error, with its line and message --------------------------

#[test]
fn delegate_errors_name_the_line_and_the_problem() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "!delegate\na: fine\nthis line has no colon",
            3,
            "line 3: expected `id: label [after dep1, dep2] [@agent]`, but there is no `:` \
             after the id",
        ),
        (
            "!delegate\nnote this: x",
            2,
            "line 2: bad task id `note this`: ids use only letters, digits, `_` and `-`",
        ),
        (
            "!delegate\n: x",
            2,
            "line 2: bad task id ``: the id is empty",
        ),
        (
            "!delegate\ncafé: x",
            2,
            "line 2: bad task id `café`: ids use only letters, digits, `_` and `-`",
        ),
        ("!delegate\na:", 2, "line 2: task `a` has an empty label"),
        (
            "!delegate\na: b\nc: [after a]",
            3,
            "line 3: task `c` has an empty label",
        ),
        (
            "!delegate\na: @ana",
            2,
            "line 2: task `a` has an empty label",
        ),
        (
            "!delegate\na: bad\u{7}bell",
            2,
            "line 2: task `a`: the label contains a control character",
        ),
        (
            "!delegate\na: x\nb: y [after a] then z",
            3,
            "line 3: task `b`: `[after ...]` must come at the end of the line (only other \
             clauses and `@agent` may follow it), and only once",
        ),
        (
            "!delegate\na: x\nb: y [after a] [after a]",
            3,
            "line 3: task `b`: `[after ...]` must come at the end of the line (only other \
             clauses and `@agent` may follow it), and only once",
        ),
        (
            "!delegate\na: x [size 3] then more",
            2,
            "line 2: task `a`: `[size ...]` must come at the end of the line (only other \
             clauses and `@agent` may follow it), and only once",
        ),
        (
            "!delegate\na: x [needs a] [priority 1] [needs b]",
            2,
            "line 2: task `a`: `[needs ...]` must come at the end of the line (only other \
             clauses and `@agent` may follow it), and only once",
        ),
        (
            "!delegate\na: x [priority high]",
            2,
            "line 2: task `a`: `[priority high]`: expected a whole number from 0 to 1000",
        ),
        (
            "!delegate\na: x [size 0]",
            2,
            "line 2: task `a`: `[size 0]`: expected a whole number from 1 to 1000000",
        ),
        (
            "!delegate\na: x [attempts: 101]",
            2,
            "line 2: task `a`: `[attempts 101]`: expected a whole number from 1 to 100",
        ),
        (
            "!delegate\na: x [due soon]",
            2,
            "line 2: task `a`: `[due soon]`: expected a duration such as 90s, 30m or 2h, \
             from 1s to 7 days",
        ),
        (
            "!delegate\na: x [due: 500ms]",
            2,
            "line 2: task `a`: `[due 500ms]`: expected a duration such as 90s, 30m or 2h, \
             from 1s to 7 days",
        ),
        (
            "!delegate\na: x [priority -1]",
            2,
            "line 2: task `a`: `[priority -1]`: expected a whole number from 0 to 1000",
        ),
        (
            "!delegate\na: x [needs ,]",
            2,
            "line 2: task `a`: `[needs]` names no capability; write `[needs rust, sql]` or \
             drop the clause",
        ),
        (
            "!delegate\na: x [after]",
            2,
            "line 2: task `a`: `[after]` names no task; write `[after a, b]` or drop the clause",
        ),
        (
            "!delegate\na: x [after b.c]",
            2,
            "line 2: task `a`: bad dependency id `b.c`: ids use only letters, digits, `_` and `-`",
        ),
        (
            "!delegate\na: x @",
            2,
            "line 2: task `a`: bad assignee `@`: agent must not be empty",
        ),
        (
            "!delegate\na: x @ana @bo",
            2,
            "line 2: task `a`: more than one @agent at the end of the line; a task has at most \
             one assignee",
        ),
        (
            "!delegate\na: x\n\nb: y\na: z",
            5,
            "line 5: duplicate task id `a` (first defined on line 2)",
        ),
        (
            "!delegate\na: x [after nope]",
            2,
            "line 2: task `a` waits for `nope`, which is not a task in this command or the room",
        ),
        (
            "!delegate\na: x [after a]",
            2,
            "line 2: task `a` waits for itself",
        ),
        (
            "!delegate\nz: free\na: x [after c]\nb: y [after a]\nc: z [after b]",
            3,
            "line 3: dependency cycle a -> c -> b -> a (each task waits for the next, so none \
             can start)",
        ),
    ];
    for (text, line, message) in cases {
        assert_eq!(reject(text), (Some(*line), message.to_string()), "{text:?}");
    }
    let long_id = format!("!delegate\n{}: x", "i".repeat(65));
    assert_eq!(
        reject(&long_id).1,
        format!(
            "line 2: bad task id `{}…`: ids are at most 64 bytes",
            "i".repeat(64)
        )
    );
}

#[test]
fn delegate_whole_command_errors() {
    assert_eq!(
        reject("!delegate"),
        (
            None,
            "no tasks: write one task per line as `id: label [after dep1, dep2] [@agent]`".into()
        )
    );
    assert_eq!(reject("!delegate\n\n# only a comment\n").0, None);

    let huge = format!("!delegate\na: {}", "x".repeat(MAX_COMMAND_BYTES));
    let (line, msg) = reject(&huge);
    assert_eq!(line, None);
    assert!(
        msg.starts_with(&format!(
            "the command is {} bytes; the limit is 262144 bytes",
            huge.len()
        )),
        "{msg}"
    );

    let mut many = String::from("!delegate\n");
    for i in 0..MAX_TASKS {
        many.push_str(&format!("t{i}: task {i}\n"));
    }
    assert_eq!(parse_delegate(&many).unwrap().tasks.len(), MAX_TASKS);
    many.push_str("one-too-many: x\n");
    assert_eq!(
        reject(&many),
        (
            Some(MAX_TASKS + 2),
            format!(
                "line {}: more than 1000 tasks in one command: split it into several !delegate \
                 messages",
                MAX_TASKS + 2
            )
        )
    );
}

#[test]
fn delegate_reports_every_problem_sorted_and_capped() {
    let e = parse_delegate("!delegate\nbad line\na: ok\nb: y [after missing]\na: dup").unwrap_err();
    let lines: Vec<_> = e.errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, [Some(2), Some(4), Some(5)]);
    assert!(e
        .to_string()
        .starts_with("!delegate rejected, no task was created:\n- line 2:"));

    let mut text = String::from("!delegate\n");
    for _ in 0..15 {
        text.push_str("no colon here\n");
    }
    let e = parse_delegate(&text).unwrap_err();
    assert_eq!((e.errors.len(), e.omitted), (MAX_REPORTED_ERRORS, 5));
    assert!(e.to_string().ends_with("\n- … and 5 more"));

    // A line that failed after its id still defines the id: no "unknown" noise.
    let e = parse_delegate("!delegate\na: [after]\nb: y [after a]").unwrap_err();
    assert_eq!(e.errors.len(), 1);

    // Two separate cycles are both named.
    let e = parse_delegate(
        "a: x [after b]\nb: y [after a]\nc: x [after d]\nd: y [after c]\ne: z [after a]",
    )
    .unwrap_err();
    let msgs: Vec<String> = e.errors.iter().map(ToString::to_string).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(msgs[0].starts_with("line 1: dependency cycle a -> b -> a"));
    assert!(msgs[1].starts_with("line 3: dependency cycle c -> d -> c"));
}

// ---- !config --------------------------------------------------------------------

#[test]
fn config_help_and_get() {
    assert_eq!(config("!config"), ConfigCommand::Help { key: None });
    assert_eq!(config("!config help"), ConfigCommand::Help { key: None });
    assert_eq!(
        config("!config help rate"),
        ConfigCommand::Help {
            key: Some(ConfigKey::Rate)
        }
    );
    assert_eq!(
        config("!config get"),
        ConfigCommand::Get {
            target: ConfigTarget::Here,
            key: None
        }
    );
    assert_eq!(
        config("!config room get claim-ttl"),
        ConfigCommand::Get {
            target: ConfigTarget::Room,
            key: Some(ConfigKey::ClaimTtl)
        }
    );
    let help = help_text(None);
    for key in ConfigKey::ALL {
        assert!(help.contains(&format!("- {key} (default ")), "{key}");
    }
    assert_eq!(
        help_text(Some(ConfigKey::Rate)),
        "rate: messages a sender may post per rate-window before agents ignore it.\n\
         Default: 10. Accepts a whole number from 1 to 1000."
    );
}

#[test]
fn config_changes_are_typed_and_clamped_with_notes() {
    let ConfigCommand::Change(c) =
        config("!config rate 0 loop-cooldown 2m responder designated responder-agent @ana")
    else {
        panic!("a change");
    };
    assert_eq!(c.target, ConfigTarget::Here);
    assert_eq!(c.body.set[&ConfigKey::Rate], ConfigValue::Count(1));
    assert_eq!(
        c.body.set[&ConfigKey::LoopCooldown],
        ConfigValue::Millis(120_000)
    );
    assert_eq!(c.notes.len(), 1);
    assert_eq!(
        c.reply_text(Some("t1")),
        "Config for this thread: responder = designated, responder-agent = ana, \
         loop-cooldown = 2m, rate = 1.\nNote: rate 0 is below the minimum 1; using 1."
    );
    assert_eq!(
        c.body.to_json(),
        json!({"set": {"rate": 1, "loop-cooldown": 120000, "responder": "designated",
                       "responder-agent": "ana"}})
    );

    let ConfigCommand::Change(r) = config("!config room reset rate max-hops") else {
        panic!("a change");
    };
    assert_eq!(r.target, ConfigTarget::Room);
    assert_eq!(
        r.reply_text(Some("t1")),
        "Reset for this room: rate, max-hops (back to the default)."
    );
    let ConfigCommand::Change(all) = config("!config reset all") else {
        panic!("a change");
    };
    assert_eq!(all.body.reset.len(), ConfigKey::ALL.len());
    assert!(all
        .reply_text(Some("t"))
        .ends_with("(back to the room's value or the default)."));
}

#[test]
fn config_change_lands_in_the_right_scope() {
    let ConfigCommand::Change(here) = config("!config rate 5") else {
        panic!()
    };
    let ConfigCommand::Change(room) = config("!config room rate 5") else {
        panic!()
    };
    let msg = row(
        9,
        0,
        "lobby",
        Some("t1"),
        Verb::MessagePosted,
        "olga",
        Role::Owner,
        json!({"text": "!config rate 5"}),
    );
    let a = here.to_interaction("lobby", Some("t1"), "olga", msg.id);
    let b = room.to_interaction("lobby", Some("t1"), "olga", msg.id);
    assert_eq!(
        (a.thread.as_deref(), b.thread.as_deref()),
        (Some("t1"), None)
    );
    assert_eq!(
        (a.verb, a.role, a.parent),
        (Verb::ConfigSet, Role::Owner, Some(msg.id))
    );
    assert_eq!(
        here.to_interaction("lobby", None, "olga", msg.id).thread,
        None
    );
}

#[test]
fn config_errors_are_clear_and_nothing_is_half_applied() {
    let cases = [
        (
            "!config rat 5",
            "!config rejected, nothing was changed: unknown config key `rat` (did you mean \
             `rate`?); `!config help` lists the keys",
        ),
        (
            "!config rate 5 loop-max lots",
            "!config rejected, nothing was changed: bad value `lots` for `loop-max`: expected \
             a whole number from 1 to 100",
        ),
        (
            "!config rate 5 claim-ttl",
            "!config rejected, nothing was changed: `claim-ttl` needs a value: a duration such \
             as 500ms, 30s, 2m or 1h, from 1s to 1h",
        ),
        (
            "!config rate 5 rate 6",
            "!config rejected, nothing was changed: `rate` is given twice; give each key once",
        ),
        (
            "!config reset",
            "!config rejected, nothing was changed: `reset` needs at least one key (or `all`), \
             e.g. `!config reset rate`",
        ),
        (
            "!config reset rate rate",
            "!config rejected, nothing was changed: `rate` is given twice; give each key once",
        ),
        (
            "!config room",
            "!config rejected, nothing was changed: `room` must be followed by `get`, `reset` \
             or `key value`",
        ),
        (
            "!config get rate now",
            "!config rejected, nothing was changed: unexpected `now` after `get`; see `!config \
             help`",
        ),
        (
            "!config help rate more",
            "!config rejected, nothing was changed: unexpected `more` after `help`; see \
             `!config help`",
        ),
        (
            "!config rat 5 claim-ttl 30 rate",
            "!config rejected, nothing was changed: 3 errors:\n- unknown config key `rat` \
             (did you mean `rate`?); `!config help` lists the keys\n- bad value `30` for \
             `claim-ttl`: expected a duration such as 500ms, 30s, 2m or 1h, from 1s to 1h\n- \
             `rate` needs a value: a whole number from 1 to 1000",
        ),
        (
            "!config rat claim-ttl 30s",
            "!config rejected, nothing was changed: unknown config key `rat` (did you mean \
             `rate`?); `!config help` lists the keys",
        ),
        (
            "!config reset rat claim-tl",
            "!config rejected, nothing was changed: 2 errors:\n- unknown config key `rat` \
             (did you mean `rate`?); `!config help` lists the keys\n- unknown config key \
             `claim-tl` (did you mean `claim-ttl`?); `!config help` lists the keys",
        ),
        (
            "!config get nope",
            "!config rejected, nothing was changed: unknown config key `nope`; `!config help` \
             lists the keys",
        ),
    ];
    for (text, message) in cases {
        assert_eq!(config_err(text), message, "{text}");
    }
    let huge = format!("!config rate {}", "9".repeat(MAX_COMMAND_BYTES));
    assert!(config_err(&huge).contains("the limit is 262144 bytes"));
}

#[test]
fn get_reply_shows_sources() {
    let mut fold = crate::config::ConfigFold::new();
    fold.apply(&row(
        1,
        0,
        "lobby",
        None,
        Verb::RoomCreated,
        "olga",
        Role::Owner,
        json!({"owner": "olga"}),
    ));
    for set in [
        row(
            2,
            0,
            "lobby",
            None,
            Verb::ConfigSet,
            "olga",
            Role::Owner,
            json!({"set": {"rate": 4}}),
        ),
        row(
            3,
            0,
            "lobby",
            Some("t1"),
            Verb::ConfigSet,
            "olga",
            Role::Owner,
            json!({"set": {"loop-max": 2}}),
        ),
    ] {
        fold.apply(&set);
    }
    let reply = get_reply(&fold, "lobby", Some("t1"), ConfigTarget::Here, None);
    assert!(reply.starts_with("Config for this thread:"), "{reply}");
    assert!(reply.contains("\n- rate = 4 (from the room)"), "{reply}");
    assert!(reply.contains("\n- loop-max = 2 (set)"), "{reply}");
    assert!(reply.contains("\n- claim-ttl = 1m (default)"), "{reply}");
    assert_eq!(
        get_reply(
            &fold,
            "lobby",
            Some("t1"),
            ConfigTarget::Room,
            Some(ConfigKey::LoopMax)
        ),
        "Config for this room:\n- loop-max = 4 (default)"
    );
}

// ---- who may command --------------------------------------------------------------

#[test]
fn only_owner_text_is_ever_a_command() {
    let texts = [
        "!delegate\na: x",
        "!config rate 5",
        "!config",
        "!delegate\nbroken",
    ];
    for text in texts {
        assert!(owner_command(Role::Owner, text).is_some(), "{text}");
        for role in [Role::Agent, Role::Human, Role::System] {
            assert!(owner_command(role, text).is_none(), "{role} {text}");
        }
    }
    for not_a_command in [
        "hello",
        "!configure rate 5",
        "!Config rate 5",
        "say !config rate 5",
        "!delegated a: x",
        "",
    ] {
        assert!(
            owner_command(Role::Owner, not_a_command).is_none(),
            "{not_a_command}"
        );
    }
    assert!(matches!(
        owner_command(Role::Owner, "  !config rate 5"),
        Some(Ok(OwnerCommand::Config(_)))
    ));
    assert!(matches!(
        owner_command(Role::Owner, "!delegate\nbroken"),
        Some(Err(CommandError::Delegate(_)))
    ));
}

#[test]
fn ledger_rows_command_only_from_the_named_owner_and_key() {
    let key = owner_secret();
    let mut owners = crate::config::ConfigFold::new();
    owners.apply(&created_with_key(1, "lobby", "olga", &key));
    let ctx = ParseContext::default();
    let post = |actor: &str, role: Role, verb: Verb| {
        let n = NewInteraction::new(
            "lobby",
            verb,
            actor,
            role,
            json!({"text": "!config rate 5"}),
        );
        materialize(key.sign(n), Position::new(0, 2), Timestamp(0))
    };
    let yes = post("olga", Role::Owner, Verb::MessagePosted);
    assert!(matches!(owner_command_in(&yes, &owners, &ctx), Some(Ok(_))));
    for no in [
        post("mallory", Role::Owner, Verb::MessagePosted),
        post("olga", Role::Human, Verb::MessagePosted),
        post("olga", Role::Agent, Verb::MessagePosted),
        post("olga", Role::Owner, Verb::TurnReplied),
        signed_post(2, "den", None, "olga", "!config rate 5", &key),
        signed_post(2, "lobby", None, "olga", "hello", &key),
        // Unsigned: the owner's name and role alone are not enough.
        row(
            2,
            0,
            "lobby",
            None,
            Verb::MessagePosted,
            "olga",
            Role::Owner,
            json!({"text": "!config rate 5"}),
        ),
    ] {
        assert!(owner_command_in(&no, &owners, &ctx).is_none(), "{no:?}");
    }
}

// ---- signatures and authority -----------------------------------------------------

/// A signed command verifies; a tampered body, another key, a signature replayed on
/// other content and a missing signature are all refused, and none of them
/// authorizes a row.
#[test]
fn only_commands_signed_by_the_room_key_execute() {
    let key = owner_secret();
    let mallory = OwnerSecret::from_seed([0x66; 32]);
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    let ctx = ParseContext::default();

    let good = signed_post(2, "lobby", None, "olga", "!config rate 5", &key);
    assert_eq!(auth.config().check_signature(&good), Ok(()));
    assert!(matches!(
        owner_command_in(&good, auth.config(), &ctx),
        Some(Ok(_))
    ));

    let mut tampered = good.content();
    tampered.body["text"] = json!("!config rate 1");
    let by_mallory = signed_post(3, "lobby", None, "olga", "!config rate 1", &mallory);
    let mut replayed = NewInteraction::new(
        "lobby",
        Verb::MessagePosted,
        "olga",
        Role::Owner,
        json!({"text": "!delegate\nx: steal the keys"}),
    );
    replayed.body[SIGNATURE_FIELD] = good.body[SIGNATURE_FIELD].clone();
    let mut missing = good.content();
    missing
        .body
        .as_object_mut()
        .unwrap()
        .remove(SIGNATURE_FIELD);
    let refused = [
        (
            materialize(tampered, Position::new(0, 4), Timestamp(0)),
            SignatureError::Invalid,
        ),
        (
            by_mallory,
            SignatureError::OtherKey {
                signed_by: mallory.public().to_hex(),
                expected: key.public().to_hex(),
            },
        ),
        (
            materialize(replayed, Position::new(0, 5), Timestamp(0)),
            SignatureError::Invalid,
        ),
        (
            materialize(missing, Position::new(0, 6), Timestamp(0)),
            SignatureError::Missing,
        ),
    ];
    for (row, why) in &refused {
        assert_eq!(
            auth.config().check_signature(row).as_ref(),
            Err(why),
            "{row:?}"
        );
        assert!(
            owner_command_in(row, auth.config(), &ctx).is_none(),
            "{row:?}"
        );
    }
    for (row, _) in &refused {
        auth.apply(row);
    }
    assert_eq!(auth.unsigned_commands(), 4);
    // Whatever config.set / task.created those would have produced is not admitted.
    let forged_set = row(
        7,
        0,
        "lobby",
        None,
        Verb::ConfigSet,
        "olga",
        Role::Owner,
        json!({"set": {"rate": 1}}),
    );
    let forged_set = materialize(
        NewInteraction {
            parent: Some(refused[0].0.id),
            ..forged_set.content()
        },
        Position::new(0, 7),
        Timestamp(0),
    );
    assert!(!auth.admits(&forged_set));
    auth.apply(&forged_set);
    assert_eq!(auth.config().effective("lobby", None).rate, 10);
}

/// A verified command authorizes exactly the rows it derives: those are admitted
/// and take effect; the same bodies hand-written (no parent, another parent, another
/// label) are not.
#[test]
fn verified_commands_authorize_exactly_their_derived_rows() {
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    let command = signed_post(
        2,
        "lobby",
        None,
        "olga",
        "!delegate\na: write\nb: test [after a]",
        &key,
    );
    auth.apply(&command);
    let Some(Ok(parsed)) = owner_command_in(&command, auth.config(), &ParseContext::default())
    else {
        panic!("the signed command parses");
    };
    let derived = derived_rows(&command, &parsed, auth.config());
    assert_eq!(derived.len(), 2);
    for (n, d) in derived.iter().enumerate() {
        let r = materialize(d.clone(), Position::new(0, 3 + n as u64), Timestamp(0));
        assert!(auth.admits(&r));
        auth.apply(&r);
    }
    assert!(auth.task_exists("lobby", "a") && auth.task_exists("lobby", "b"));

    let mut forged = derived[0].clone();
    forged.parent = None;
    forged.body["task"] = json!("c");
    let mut relabelled = derived[0].clone();
    relabelled.body["label"] = json!("exfiltrate");
    for (n, f) in [forged, relabelled].into_iter().enumerate() {
        let r = materialize(f, Position::new(0, 10 + n as u64), Timestamp(0));
        assert!(!auth.admits(&r), "{r:?}");
        auth.apply(&r);
    }
    assert!(!auth.task_exists("lobby", "c"));
    assert_eq!(auth.unauthorized_rows(), 2);

    // A signed !config change takes effect through its derived config.set only.
    let config = signed_post(20, "lobby", None, "olga", "!config rate 5", &key);
    auth.apply(&config);
    let Some(Ok(parsed)) = owner_command_in(&config, auth.config(), &ParseContext::default())
    else {
        panic!("the signed !config parses");
    };
    let set = derived_rows(&config, &parsed, auth.config()).remove(0);
    auth.apply(&materialize(set, Position::new(0, 21), Timestamp(0)));
    assert_eq!(auth.config().effective("lobby", None).rate, 5);
}

/// The first room.created wins: a later one (any key, any actor) changes neither
/// the owner nor the key and is counted.
#[test]
fn a_later_room_created_changes_nothing() {
    let key = owner_secret();
    let mallory = OwnerSecret::from_seed([0x66; 32]);
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    auth.apply(&created_with_key(2, "lobby", "mallory", &mallory));
    auth.apply(&created_with_key(3, "lobby", "olga", &mallory));
    assert_eq!(auth.config().owner("lobby"), Some("olga"));
    assert_eq!(auth.config().owner_key("lobby"), Some(key.public()));
    assert_eq!(auth.config().ignored_rows(), 2);
    let by_mallory = signed_post(4, "lobby", None, "olga", "!config rate 1", &mallory);
    assert!(owner_command_in(&by_mallory, auth.config(), &ParseContext::default()).is_none());
}

/// A rotation signed by the current key replaces it from then on; one signed by any
/// other key, or unsigned, or by someone else, is ignored.
#[test]
fn key_rotation_is_honoured_from_then_on() {
    let old = owner_secret();
    let new = OwnerSecret::from_seed([0x22; 32]);
    let mallory = OwnerSecret::from_seed([0x66; 32]);
    let rotate = |pos: u64, actor: &str, to: &OwnerSecret, by: Option<&OwnerSecret>| {
        let n = NewInteraction::new(
            "lobby",
            Verb::RoomKeyRotated,
            actor,
            Role::Owner,
            json!({"key": to.public().to_hex()}),
        );
        let n = match by {
            Some(k) => k.sign(n),
            None => n,
        };
        materialize(n, Position::new(0, pos), Timestamp(0))
    };
    let ctx = ParseContext::default();
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &old));
    let before = signed_post(2, "lobby", None, "olga", "!config rate 5", &old);
    assert!(owner_command_in(&before, auth.config(), &ctx).is_some());

    // Forged rotations: by mallory's key, unsigned, in another actor's name.
    auth.apply(&rotate(3, "olga", &mallory, Some(&mallory)));
    auth.apply(&rotate(4, "olga", &mallory, None));
    auth.apply(&rotate(5, "mallory", &mallory, Some(&old)));
    assert_eq!(auth.config().owner_key("lobby"), Some(old.public()));
    assert_eq!(auth.config().ignored_rows(), 3);

    auth.apply(&rotate(6, "olga", &new, Some(&old)));
    assert_eq!(auth.config().owner_key("lobby"), Some(new.public()));
    let with_old = signed_post(7, "lobby", None, "olga", "!config rate 6", &old);
    let with_new = signed_post(8, "lobby", None, "olga", "!config rate 6", &new);
    assert!(owner_command_in(&with_old, auth.config(), &ctx).is_none());
    assert!(owner_command_in(&with_new, auth.config(), &ctx).is_some());
    // The old key cannot rotate any more.
    auth.apply(&rotate(9, "olga", &mallory, Some(&old)));
    assert_eq!(auth.config().owner_key("lobby"), Some(new.public()));
}

/// A room whose room.created names no key runs no owner command at all.
#[test]
fn a_room_without_an_owner_key_runs_no_command() {
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    auth.apply(&row(
        1,
        0,
        "lobby",
        None,
        Verb::RoomCreated,
        "olga",
        Role::Owner,
        json!({"owner": "olga"}),
    ));
    let signed = signed_post(2, "lobby", None, "olga", "!config rate 5", &key);
    assert_eq!(
        auth.config().check_signature(&signed),
        Err(SignatureError::NoKey)
    );
    assert!(owner_command_in(&signed, auth.config(), &ParseContext::default()).is_none());
}

// ---- properties -------------------------------------------------------------------

/// A random DAG over `n` tasks: task `i` may wait only for tasks `< i`.
fn any_dag() -> impl Strategy<Value = Vec<Vec<usize>>> {
    (1usize..40).prop_flat_map(|n| {
        (0..n)
            .map(|i| {
                prop::collection::btree_set(0..i.max(1), 0..=i.min(4))
                    .prop_map(move |s| s.into_iter().filter(|&d| d < i).collect::<Vec<_>>())
            })
            .collect::<Vec<_>>()
    })
}

fn render(deps: &[Vec<usize>], order: &[usize]) -> String {
    let mut text = String::from("!delegate\n");
    for &i in order {
        text.push_str(&format!("t{i}: do thing {i}"));
        if !deps[i].is_empty() {
            let list: Vec<String> = deps[i].iter().map(|d| format!("t{d}")).collect();
            text.push_str(&format!(" [after {}]", list.join(", ")));
        }
        text.push('\n');
    }
    text
}

/// Whether `to` is reachable from `from` along "waits for".
fn reaches(deps: &[Vec<usize>], from: usize, to: usize) -> bool {
    let mut stack = vec![from];
    let mut seen = vec![false; deps.len()];
    while let Some(n) = stack.pop() {
        if n == to {
            return true;
        }
        if !std::mem::replace(&mut seen[n], true) {
            stack.extend(&deps[n]);
        }
    }
    false
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn delegate_never_panics_on_arbitrary_text(text in "\\PC*") {
        let _ = parse_delegate(&text);
        let _ = owner_command(Role::Owner, &format!("!delegate\n{text}"));
    }

    #[test]
    fn delegate_never_panics_on_token_soup(parts in prop::collection::vec(
        prop::sample::select(vec!["a", "b", "-", "_", ":", " ", "\n", "\r\n", "[", "]", "[after ",
            "after", ",", "@", "@ana", "#", "é", "\u{0}", "\t", "!delegate", "*", "•"]), 0..60)) {
        let text: String = parts.concat();
        if let Ok(plan) = parse_delegate(&text) {
            // Whatever is accepted is a valid, ordered DAG.
            let mut seen = std::collections::BTreeSet::new();
            for task in &plan.tasks {
                prop_assert!(!task.label.is_empty());
                for d in &task.deps {
                    prop_assert!(seen.contains(d), "{} before its dep {}", task.id, d);
                }
                prop_assert!(seen.insert(task.id.clone()));
            }
        }
    }

    #[test]
    fn config_never_panics(text in "\\PC*") {
        let _ = parse_config(&text);
        let _ = owner_command(Role::Owner, &format!("!config {text}"));
    }

    #[test]
    fn dags_are_accepted_and_any_back_edge_is_rejected(
        deps in any_dag(),
        shuffle in any::<u64>(),
        back in any::<(usize, usize)>(),
    ) {
        let n = deps.len();
        // Write the lines in a scrambled order: order of lines must not matter.
        let mut order: Vec<usize> = (0..n).collect();
        let mut s = shuffle;
        for i in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        let plan = parse_delegate(&render(&deps, &order)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(plan.tasks.len(), n);
        let pos: std::collections::BTreeMap<String, usize> =
            plan.tasks.iter().enumerate().map(|(i, t)| (t.id.clone(), i)).collect();
        for (i, ds) in deps.iter().enumerate() {
            for d in ds {
                let (dep_at, task_at) = (pos[&format!("t{d}")], pos[&format!("t{i}")]);
                prop_assert!(dep_at < task_at);
            }
        }

        // Make `from` wait for a task that already (transitively) waits for `from`,
        // or for itself: that closes a cycle.
        let from = back.0 % n;
        let closers: Vec<usize> = (0..n).filter(|&to| reaches(&deps, to, from)).collect();
        let to = closers[back.1 % closers.len()];
        let mut cyclic = deps.clone();
        cyclic[from].push(to);
        let err = parse_delegate(&render(&cyclic, &order)).expect_err("a cycle must be rejected");
        let kinds_ok = err.errors.iter().all(|e| matches!(
            e.kind,
            DelegateErrorKind::Cycle { .. } | DelegateErrorKind::SelfDep { .. }
        ));
        prop_assert!(kinds_ok, "{}", err);
    }
}

#[test]
fn a_seeded_room_is_what_the_authority_admits() {
    let key = owner_secret();
    let rows = seed_room(
        "r",
        "ana",
        &key,
        &[
            "!config max-attempts 2",
            "!delegate\na: first\nb: second [after a]",
        ],
    )
    .unwrap();
    let mut auth = OwnerAuthority::new();
    let mut dag = crate::tasks::TaskDag::new();
    for (n, r) in rows.into_iter().enumerate() {
        let read = materialize(r, Position::new(0, n as u64 + 1), Timestamp(0));
        auth.apply(&read);
        if auth.admits(&read) {
            dag.apply(&read);
        }
    }
    assert_eq!((auth.unsigned_commands(), auth.unauthorized_rows()), (0, 0));
    assert_eq!(auth.config().effective("r", None).max_attempts, 2);
    let b = dag.task("r", "b").expect("task b");
    assert_eq!(b.deps, vec!["a".to_string()]);
    assert!(dag.task("r", "a").is_some());
    // Text that is not an accepted command is refused, naming it.
    let err = seed_room("r", "ana", &key, &["!delegate\nb: x [after nowhere]"]).unwrap_err();
    assert!(err.contains("nowhere"), "{err}");
    assert!(seed_room("r", "ana", &key, &["hello"]).is_err());
}

// ---- delegation by agents -----------------------------------------------------------

/// An agent's `!delegate` with its derived rows, as `task_delegate` writes them.
fn agent_delegate(agent: &str, text: &str, auth: &OwnerAuthority) -> Vec<NewInteraction> {
    let message = NewInteraction::new(
        "r",
        Verb::MessagePosted,
        agent,
        Role::Agent,
        json!({ "text": text }),
    );
    let exists = |id: &str| auth.task_exists("r", id);
    let ctx = ParseContext {
        task_exists: &exists,
        ..ParseContext::default()
    };
    delegate_rows(message, auth.config(), &ctx).expect("the plan parses")
}

/// A delegator's tasks are admitted by the authority and reach the DAG; the same
/// rows from an agent the owner did not allow, or from the delegator after the owner
/// removed it, are not.
#[test]
fn only_delegators_tasks_are_admitted_while_they_are_delegators() {
    let key = owner_secret();
    let seeded = seed_room("r", "ana", &key, &["!config delegators lead,@planner"]).unwrap();
    let mut auth = OwnerAuthority::new();
    let mut dag = crate::tasks::TaskDag::new();
    let mut seq = 0;
    let mut feed = |rows: Vec<NewInteraction>,
                    auth: &mut OwnerAuthority,
                    dag: &mut crate::tasks::TaskDag|
     -> usize {
        let mut admitted = 0;
        for r in rows {
            seq += 1;
            let read = materialize(r, Position::new(0, seq), Timestamp(0));
            auth.apply(&read);
            if auth.admits(&read) {
                dag.apply(&read);
                admitted += usize::from(read.verb == Verb::TaskCreated);
            }
        }
        admitted
    };
    feed(seeded, &mut auth, &mut dag);
    assert_eq!(
        auth.config().effective("r", None).delegators,
        vec!["lead".to_string(), "planner".to_string()]
    );
    let by_lead = agent_delegate("lead", "!delegate\na: spec\nb: build [after a] @bo", &auth);
    assert_eq!(by_lead.len(), 3);
    assert_eq!(feed(by_lead, &mut auth, &mut dag), 2);
    let b = dag
        .task("r", "b")
        .expect("the delegator's task is in the DAG");
    assert_eq!(
        (b.created_by.as_str(), b.deps.clone()),
        ("lead", vec!["a".into()])
    );
    // May wait for existing tasks, may not reuse their ids (the owner's grammar).
    let exists = |id: &str| auth.task_exists("r", id);
    let ctx = ParseContext {
        task_exists: &exists,
        ..ParseContext::default()
    };
    let again = NewInteraction::new(
        "r",
        Verb::MessagePosted,
        "lead",
        Role::Agent,
        json!({"text": "!delegate\na: again"}),
    );
    let err = delegate_rows(again, auth.config(), &ctx).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");

    // Mallory is no delegator: her rows (built the same way) count nowhere.
    let by_mallory = agent_delegate("mallory", "!delegate\nm: exfiltrate", &auth);
    assert_eq!(feed(by_mallory, &mut auth, &mut dag), 0);
    assert_eq!(auth.undelegated_commands(), 1);
    assert_eq!(auth.unauthorized_rows(), 1);
    assert!(dag.task("r", "m").is_none());

    // The owner removes the delegators: lead's next plan counts nowhere.
    let removal = command_rows(
        key.sign(NewInteraction::new(
            "r",
            Verb::MessagePosted,
            "ana",
            Role::Owner,
            json!({"text": "!config delegators none"}),
        )),
        auth.config(),
    )
    .unwrap()
    .unwrap();
    feed(removal, &mut auth, &mut dag);
    let late = agent_delegate("lead", "!delegate\nc: more", &auth);
    assert_eq!(feed(late, &mut auth, &mut dag), 0);
    assert!(dag.task("r", "c").is_none());
    assert_eq!(auth.undelegated_commands(), 2);
}

#[test]
fn delegators_is_an_owner_config_list() {
    match config("!config delegators b,a,@a") {
        ConfigCommand::Change(c) => assert_eq!(
            c.body.set[&ConfigKey::Delegators],
            ConfigValue::Agents(vec!["a".into(), "b".into()])
        ),
        other => panic!("{other:?}"),
    }
    assert!(config_err("!config delegators a,,b").contains("agent names separated by commas"));
    assert!(config_err("!config delegators a/b").contains("bad value"));
}

// ---- agents bound to writers -------------------------------------------------------

/// A signed `!config` by the room owner `ana` of room `r`, as the rows a relay
/// appends for it.
fn owner_config(key: &OwnerSecret, text: &str, auth: &OwnerAuthority) -> Vec<NewInteraction> {
    let message = key.sign(NewInteraction::new(
        "r",
        Verb::MessagePosted,
        "ana",
        Role::Owner,
        json!({"text": text}),
    ));
    command_rows(message, auth.config()).unwrap().unwrap()
}

/// The owner binds ada to r0 and r2: ada's rows written by r0 or r2 count, by r1 they
/// are ignored and counted, from the binding's row on and until `none` clears it.
/// Other agents, and rows of other roles under the name, are untouched.
#[test]
fn rows_as_a_bound_agent_count_only_from_its_writers() {
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    let mut seq = 0;
    // Folds `rows` as written by `writer`; returns how many were admitted.
    let mut feed = |rows: Vec<NewInteraction>, writer: &str, auth: &mut OwnerAuthority| {
        let mut admitted = 0;
        for r in rows {
            seq += 1;
            let mut read = materialize(r, Position::new(0, seq), Timestamp(0));
            read.relay = writer.into();
            auth.apply(&read);
            admitted += usize::from(auth.admits(&read));
        }
        admitted
    };
    let claim = |agent: &str, role: Role, n: u64| {
        NewInteraction::new(
            "r",
            Verb::TaskClaimed,
            agent,
            role,
            json!({"task": "t", "epoch": n}),
        )
    };
    feed(seed_room("r", "ana", &key, &[]).unwrap(), "r0", &mut auth);

    // Before the binding: anyone may write as ada.
    assert_eq!(feed(vec![claim("ada", Role::Agent, 1)], "r1", &mut auth), 1);

    // The binding's own rows may be written by any relay (it is the owner's row).
    let bind = owner_config(&key, "!config agents ada@r0,@ada@r2", &auth);
    assert_eq!(feed(bind, "r1", &mut auth), 2);
    assert_eq!(
        auth.config().effective("r", None).agents,
        vec![
            crate::config::AgentBinding::parse("ada@r0").unwrap(),
            crate::config::AgentBinding::parse("ada@r2").unwrap()
        ]
    );
    assert_eq!(feed(vec![claim("ada", Role::Agent, 2)], "r0", &mut auth), 1);
    assert_eq!(feed(vec![claim("ada", Role::Agent, 3)], "r2", &mut auth), 1);
    assert_eq!(auth.misbound_rows(), 0);
    // By another writer: ignored and counted, in the room and in its threads; a
    // forged `!delegate` as ada authorizes nothing either.
    let forged = vec![
        claim("ada", Role::Agent, 4),
        claim("ada", Role::Agent, 5).in_thread("side"),
        NewInteraction::new(
            "r",
            Verb::MessagePosted,
            "ada",
            Role::Agent,
            json!({"text": "!delegate\nx: forged"}),
        ),
    ];
    assert_eq!(feed(forged, "r1", &mut auth), 0);
    assert_eq!(auth.misbound_rows(), 3);
    assert_eq!(auth.undelegated_commands(), 0, "never parsed");
    // Unbound agents and other roles under the name: as before.
    let others = vec![claim("bo", Role::Agent, 6), claim("ada", Role::Human, 7)];
    assert_eq!(feed(others, "r1", &mut auth), 2);
    assert_eq!(auth.misbound_rows(), 3);

    // `none` clears the binding: ada's rows from r1 count again.
    let clear = owner_config(&key, "!config agents none", &auth);
    assert_eq!(feed(clear, "r0", &mut auth), 2);
    assert_eq!(feed(vec![claim("ada", Role::Agent, 8)], "r1", &mut auth), 1);
    assert_eq!(auth.misbound_rows(), 3);
}

#[test]
fn agents_is_an_owner_config_list_of_bindings() {
    match config("!config agents ada@relay-b,ada@relay-a,@bo@relay-b,ada@relay-a") {
        ConfigCommand::Change(c) => {
            let value = &c.body.set[&ConfigKey::Agents];
            assert_eq!(value.to_string(), "ada@relay-a,ada@relay-b,bo@relay-b");
            assert_eq!(
                value.to_json(),
                json!(["ada@relay-a", "ada@relay-b", "bo@relay-b"])
            );
            assert_eq!(
                ConfigKey::Agents.value_from_json(&value.to_json()).as_ref(),
                Ok(value)
            );
        }
        other => panic!("{other:?}"),
    }
    match config("!config agents none") {
        ConfigCommand::Change(c) => {
            assert_eq!(
                c.body.set[&ConfigKey::Agents],
                ConfigValue::Bindings(vec![])
            )
        }
        other => panic!("{other:?}"),
    }
    for bad in ["ada", "ada@", "ada@r0,,bo@r1", "ada@r/0", "a b@r0"] {
        let err = config_err(&format!("!config agents {bad}"));
        assert!(err.contains("agent@writer entries"), "{bad}: {err}");
    }
    assert!(ConfigKey::Agents.value_from_json(&json!(["ada"])).is_err());
}

// ---- signed writers and required signatures -------------------------------------

/// Folds rows as a reader sees them: written by `writer`, signed by `signer` (the
/// store verified the signature on read). Returns how many were admitted.
struct Reader {
    auth: OwnerAuthority,
    seq: u64,
}

impl Reader {
    fn new() -> Self {
        Reader {
            auth: OwnerAuthority::new(),
            seq: 0,
        }
    }

    fn feed(
        &mut self,
        rows: Vec<NewInteraction>,
        writer: &str,
        signer: Option<&OwnerSecret>,
    ) -> usize {
        let mut admitted = 0;
        for r in rows {
            self.seq += 1;
            let mut read = materialize(r, Position::new(0, self.seq), Timestamp(0));
            read.relay = writer.into();
            read.signer = signer.map(OwnerSecret::public);
            self.auth.apply(&read);
            admitted += usize::from(self.auth.admits(&read));
        }
        admitted
    }
}

fn said(actor: &str, role: Role, text: &str) -> NewInteraction {
    NewInteraction::new(
        "r",
        Verb::MessagePosted,
        actor,
        role,
        json!({ "text": text }),
    )
}

/// Registered writer keys and `require-signatures`: a registered writer's rows count
/// only when signed by its key; once signatures are required, unsigned rows count only
/// when the owner signed them or an admitted command derived them. Each refusal is
/// counted once, by kind, and the rules apply from their config rows on.
#[test]
fn writers_keys_and_required_signatures_decide_which_rows_count() {
    let owner = owner_secret();
    let (k0, k1, mallory) = (
        OwnerSecret::from_seed([0x10; 32]),
        OwnerSecret::from_seed([0x11; 32]),
        OwnerSecret::from_seed([0x66; 32]),
    );
    let mut r = Reader::new();
    r.feed(seed_room("r", "ana", &owner, &[]).unwrap(), "cli", None);
    let chat = |n: u32| said("bo", Role::Human, &format!("hello {n}"));

    // Before any key is registered every row counts, signed or not.
    assert_eq!(r.feed(vec![chat(1)], "r0", None), 1);
    assert_eq!(r.feed(vec![chat(2)], "r0", Some(&mallory)), 1);

    // The owner registers r0's key. Its command and config.set may be stored by an
    // unsigned writer: they are the owner's.
    let text = format!("!config relay-keys r0={}", k0.public().to_hex());
    let register = owner_config(&owner, &text, &r.auth);
    assert_eq!(r.feed(register, "cli", None), 2);
    assert_eq!(
        r.auth.config().effective("r", None).relay_keys,
        vec![
            crate::config::binding::RelayKey::parse(&text["!config relay-keys ".len()..]).unwrap()
        ]
    );
    assert_eq!(r.feed(vec![chat(3)], "r0", Some(&k0)), 1);
    // Under r0's name without its key: unsigned, signed by another key.
    assert_eq!(r.feed(vec![chat(4)], "r0", None), 0);
    assert_eq!(r.feed(vec![chat(5)], "r0", Some(&mallory)), 0);
    assert_eq!(r.auth.forged_writer_rows(), 2);
    // Writers without keys still count: signatures are not required yet.
    assert_eq!(r.feed(vec![chat(6)], "r1", None), 1);
    assert_eq!(r.auth.unsigned_rows(), 0);

    // Require signatures (stored by an unsigned writer: the owner's rows).
    let text = format!(
        "!config relay-keys r0={},r1={}",
        k0.public().to_hex(),
        k1.public().to_hex()
    );
    assert_eq!(r.feed(owner_config(&owner, &text, &r.auth), "cli", None), 2);
    let require = owner_config(&owner, "!config require-signatures on", &r.auth);
    assert_eq!(r.feed(require, "cli", None), 2);
    assert!(r.auth.config().effective("r", None).require_signatures);

    // Unsigned, or signed by a key no writer has registered: ignored, counted.
    assert_eq!(r.feed(vec![chat(7)], "cli", None), 0);
    assert_eq!(r.feed(vec![chat(8)], "cli", Some(&mallory)), 0);
    assert_eq!(
        r.feed(
            vec![said("ana", Role::Owner, "unsigned owner chat")],
            "cli",
            None
        ),
        0
    );
    let forged_task = NewInteraction::new(
        "r",
        Verb::TaskCreated,
        "ana",
        Role::Owner,
        json!({"task": "forged", "label": "x"}),
    );
    assert_eq!(r.feed(vec![forged_task], "cli", None), 0);
    assert_eq!(r.auth.unsigned_rows(), 4);
    assert_eq!(
        r.auth.unauthorized_rows(),
        0,
        "never reached the task check"
    );
    // Signed by the writer's registered key: counts.
    assert_eq!(r.feed(vec![chat(9)], "r1", Some(&k1)), 1);
    // The owner's signed rows count whoever stored them, and so do the rows a
    // verified command derives; an owner-signed plain message counts too.
    let delegate = owner_config(
        &owner,
        "!delegate
t1: the real task",
        &r.auth,
    );
    assert_eq!(delegate.len(), 2);
    assert_eq!(r.feed(delegate, "cli", None), 2);
    assert!(r.auth.task_exists("r", "t1"));
    let signed_chat = owner.sign(said("ana", Role::Owner, "signed owner chat"));
    assert_eq!(r.feed(vec![signed_chat], "cli", None), 1);
    // A delegator agent's `!delegate` must be writer-signed; its derived rows then
    // count whoever stored them.
    let allow = owner_config(&owner, "!config delegators lead", &r.auth);
    assert_eq!(r.feed(allow, "cli", None), 2);
    let lead = said(
        "lead",
        Role::Agent,
        "!delegate
t2: the lead's task",
    );
    let rows = delegate_rows(lead.clone(), r.auth.config(), &ParseContext::default()).unwrap();
    assert_eq!(r.feed(vec![lead.clone()], "cli", None), 0);
    assert!(!r.auth.task_exists("r", "t2"));
    assert_eq!(r.feed(vec![rows[0].clone()], "r0", Some(&k0)), 1);
    assert_eq!(r.feed(vec![rows[1].clone()], "cli", None), 1);
    assert!(r.auth.task_exists("r", "t2"));
    assert_eq!(r.auth.unsigned_rows(), 5);
    assert_eq!(r.auth.forged_writer_rows(), 2);

    // The binding holds on the proven writer: ada bound to r0, written by r1 with
    // r1's own key, is misbound.
    let bind = owner_config(&owner, "!config agents ada@r0", &r.auth);
    assert_eq!(r.feed(bind, "cli", None), 2);
    assert_eq!(
        r.feed(vec![said("ada", Role::Agent, "as ada")], "r1", Some(&k1)),
        0
    );
    assert_eq!(r.auth.misbound_rows(), 1);
    assert_eq!(
        r.feed(vec![said("ada", Role::Agent, "as ada")], "r0", Some(&k0)),
        1
    );

    // Off again: unsigned rows of writers without keys count; r0's still need its key.
    let off = owner_config(&owner, "!config require-signatures off", &r.auth);
    assert_eq!(r.feed(off, "cli", None), 2);
    assert_eq!(r.feed(vec![chat(10)], "cli", None), 1);
    assert_eq!(r.feed(vec![chat(11)], "r0", None), 0);
    assert_eq!(r.auth.forged_writer_rows(), 3);
    assert_eq!(r.auth.unsigned_rows(), 5);
}

/// The trust keys are room-wide: set or reset in a thread they are refused with a
/// clear error (`room` forces the room), `reset all` in a thread leaves them, and a
/// thread overlay holding one (a hand-written row) is not read.
#[test]
fn trust_keys_are_room_wide() {
    let key = OwnerSecret::from_seed([0x10; 32]).public().to_hex();
    for text in [
        "!config agents ada@r0".to_string(),
        format!("!config relay-keys r0={key}"),
        "!config require-signatures on".to_string(),
        "!config reset agents".to_string(),
        "!config rate 5 require-signatures on".to_string(),
        // Not a trust key, but room-wide too: tasks belong to the room (plan 0095).
        "!config compact-turns on".to_string(),
    ] {
        let err = parse_config_in(&text, Some("side")).expect_err(&text);
        let err = CommandError::from(err).to_string();
        assert!(
            err.contains("applies to the whole room") && err.contains("!config room"),
            "{text}: {err}"
        );
        // Outside a thread, or with `room`, it is accepted.
        assert!(parse_config_in(&text, None).is_ok(), "{text}");
        let forced = text.replacen("!config ", "!config room ", 1);
        match parse_config_in(&forced, Some("side")) {
            Ok(ConfigCommand::Change(c)) => assert_eq!(c.target, ConfigTarget::Room),
            other => panic!("{forced}: {other:?}"),
        }
    }
    match parse_config_in("!config reset all", Some("side")) {
        Ok(ConfigCommand::Change(c)) => {
            assert!(c.body.reset.contains(&ConfigKey::Rate));
            assert!(!c.body.reset.iter().any(|k| k.room_wide()), "{c:?}");
        }
        other => panic!("{other:?}"),
    }
    // A signed command in a thread is answered with the error and derives nothing.
    let owner = owner_secret();
    let mut r = Reader::new();
    r.feed(seed_room("r", "ana", &owner, &[]).unwrap(), "cli", None);
    let msg = owner.sign(said("ana", Role::Owner, "!config agents ada@r0").in_thread("side"));
    assert!(matches!(
        command_rows(msg, r.auth.config()),
        Some(Err(CommandError::Config(ConfigError::RoomWide { .. })))
    ));
    // A thread overlay (fed to the config fold directly) is not read for these keys.
    let mut fold = crate::config::ConfigFold::new();
    fold.apply(&created_with_key(1, "r", "ana", &owner));
    fold.apply(&row(
        2,
        0,
        "r",
        Some("side"),
        Verb::ConfigSet,
        "ana",
        Role::Owner,
        json!({"set": {"agents": ["ada@r9"], "require-signatures": true, "rate": 5}}),
    ));
    let thread = fold.effective("r", Some("side"));
    assert_eq!(thread.rate, 5);
    assert!(
        thread.agents.is_empty() && !thread.require_signatures,
        "{thread:?}"
    );
    assert_eq!(
        fold.value("r", Some("side"), ConfigKey::RequireSignatures),
        ConfigValue::Flag(false)
    );
}

#[test]
fn relay_keys_is_an_owner_config_list_of_writer_keys() {
    let a = OwnerSecret::from_seed([1; 32]).public().to_hex();
    let b = OwnerSecret::from_seed([2; 32]).public().to_hex();
    match config(&format!("!config relay-keys r1={b},r0={a},r1={b}")) {
        ConfigCommand::Change(c) => {
            let value = &c.body.set[&ConfigKey::RelayKeys];
            assert_eq!(value.to_string(), format!("r0={a},r1={b}"));
            assert_eq!(
                value.to_json(),
                json!([format!("r0={a}"), format!("r1={b}")])
            );
            assert_eq!(
                ConfigKey::RelayKeys
                    .value_from_json(&value.to_json())
                    .as_ref(),
                Ok(value)
            );
        }
        other => panic!("{other:?}"),
    }
    for bad in [
        "r0",
        "r0=abc",
        &format!("r0={a},,r1={b}"),
        &format!("r 0={a}"),
    ] {
        let err = config_err(&format!("!config relay-keys {bad}"));
        assert!(err.contains("writer=key entries"), "{bad}: {err}");
    }
    assert!(ConfigKey::RelayKeys
        .value_from_json(&json!(["r0=zz"]))
        .is_err());
    assert_eq!(
        ConfigKey::RequireSignatures.parse_value("on").unwrap().0,
        ConfigValue::Flag(true)
    );
}

// ---- approvals ----------------------------------------------------------------------

fn approval_request(pos: u64, id: &str) -> crate::model::Interaction {
    row(
        pos,
        0,
        "lobby",
        None,
        Verb::ApprovalRequested,
        "bo",
        Role::Agent,
        json!({"approval": id, "action": "deploy to prod"}),
    )
}

#[test]
fn approve_and_deny_parse_against_the_rooms_requests() {
    use crate::approval::ApprovalStatus::*;
    let status = |id: &str| match id {
        "ap-1" => Some(Pending),
        "ap-2" => Some(Approved),
        _ => None,
    };
    let ctx = ParseContext {
        approval: &status,
        ..ParseContext::default()
    };
    let parse = |text: &str| owner_command_with(Role::Owner, text, &ctx).unwrap();
    assert_eq!(
        parse("!approve ap-1"),
        Ok(OwnerCommand::Approval(ApprovalCommand {
            id: "ap-1".into(),
            verdict: Approved,
            reason: None
        }))
    );
    let Ok(OwnerCommand::Approval(denied)) = parse("  !deny ap-1  too risky\non a Friday ") else {
        panic!("a deny with a reason parses");
    };
    assert_eq!(denied.reason.as_deref(), Some("too risky\non a Friday"));
    assert_eq!(denied.reply_text(), "Denied ap-1: too risky\non a Friday");
    let err = |text: &str| parse(text).unwrap_err().to_string();
    assert_eq!(
        err("!approve ap-9"),
        "not recorded: there is no approval request `ap-9` in this room; `huddle approvals` lists them"
    );
    assert!(err("!deny ap-2 no").contains("was already approved; the first answer stands"));
    assert!(err("!approve").contains("needs the id of an approval request"));
    assert!(err("!approve ap/1").contains("is not an approval id"));
    assert!(err("!approve ap-1 now").contains("only `!deny` takes a reason"));
    assert_eq!(command_word("!approved ap-1"), None);
    assert!(owner_command(Role::Agent, "!approve ap-1").is_none());
}

/// Only the owner's signed answer counts, and only the first one; an agent's,
/// another human's or an unsigned owner's `!approve` is text.
#[test]
fn only_the_owners_signed_first_answer_counts() {
    use crate::approval::ApprovalStatus::*;
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    auth.apply(&approval_request(2, "ap-1"));
    auth.apply(&approval_request(3, "ap-2"));
    // A second request under a taken id is ignored.
    auth.apply(&row(
        4,
        0,
        "lobby",
        None,
        Verb::ApprovalRequested,
        "mallory",
        Role::Agent,
        json!({"approval": "ap-1", "action": "something else"}),
    ));
    assert_eq!(auth.approvals().ignored_rows(), 1);
    assert_eq!(
        auth.approvals().get("lobby", "ap-1").unwrap().requested_by,
        "bo"
    );
    let forged = [
        row(
            5,
            0,
            "lobby",
            None,
            Verb::MessagePosted,
            "bo",
            Role::Agent,
            json!({"text": "!approve ap-1"}),
        ),
        row(
            6,
            0,
            "lobby",
            None,
            Verb::MessagePosted,
            "hu",
            Role::Human,
            json!({"text": "!approve ap-1"}),
        ),
        row(
            7,
            0,
            "lobby",
            None,
            Verb::MessagePosted,
            "olga",
            Role::Owner,
            json!({"text": "!approve ap-1"}),
        ),
        signed_post(
            8,
            "lobby",
            None,
            "olga",
            "!approve ap-1",
            &OwnerSecret::from_seed([0x66; 32]),
        ),
    ];
    for f in &forged {
        auth.apply(f);
    }
    assert_eq!(auth.approvals().status("lobby", "ap-1"), Some(Pending));
    assert_eq!(auth.unsigned_commands(), 2);

    let approve = signed_post(9, "lobby", None, "olga", "!approve ap-1", &key);
    auth.apply(&approve);
    let deny = signed_post(10, "lobby", None, "olga", "!deny ap-2 not today", &key);
    auth.apply(&deny);
    let late = signed_post(
        11,
        "lobby",
        None,
        "olga",
        "!deny ap-1 changed my mind",
        &key,
    );
    auth.apply(&late);
    let approvals = auth.approvals();
    assert_eq!(approvals.status("lobby", "ap-1"), Some(Approved));
    let ap2 = approvals.get("lobby", "ap-2").unwrap();
    assert_eq!(ap2.status(), Denied);
    assert_eq!(
        ap2.answer.as_ref().unwrap().reason.as_deref(),
        Some("not today")
    );
    assert_eq!(approvals.pending("lobby").len(), 0);
    // What a relay replying to the command parses with: before its own answer.
    assert_eq!(
        approvals.status_before("lobby", "ap-1", approve.id),
        Some(Pending)
    );
    assert_eq!(
        approvals.status_before("lobby", "ap-1", late.id),
        Some(Approved)
    );
}

proptest! {
    /// Whatever follows the command word, the approval parser answers without
    /// panicking, and accepts only ids of pending requests.
    #[test]
    fn approval_commands_never_panic(rest in "\\PC{0,80}", deny in any::<bool>()) {
        let pending = |id: &str| (id == "ap-1").then_some(crate::approval::ApprovalStatus::Pending);
        let ctx = ParseContext { approval: &pending, ..ParseContext::default() };
        let (text, word) = if deny {
            (format!("!deny {rest}"), CommandWord::Deny)
        } else {
            (format!("!approve {rest}"), CommandWord::Approve)
        };
        if let Ok(a) = parse_approval(&text, word, &ctx) {
            prop_assert_eq!(a.id, "ap-1");
        }
        // A word that does not match the text is no id, never a panic.
        prop_assert!(parse_approval("!x", word, &ctx).is_err());
    }
}

#[test]
fn uses_clauses_name_resources_and_modes_in_the_global_order() {
    let text = "!delegate\n\
                a: edit docs [uses file:docs/**]\n\
                b: build [USES: slot:build permits 2, file:src/** shared] [after a]\n\
                c: call [uses api:github Exclusive, slot:ci permits-3]";
    let plan = parse_delegate(text).expect("accepted");
    let uses: Vec<(String, Vec<String>)> = plan
        .tasks
        .iter()
        .map(|t| {
            (
                t.id.clone(),
                t.uses
                    .iter()
                    .map(|w| format!("{} {}", w.name, w.mode))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        uses,
        vec![
            ("a".into(), vec!["file:docs/** exclusive".into()]),
            (
                "b".into(),
                vec!["file:src/** shared".into(), "slot:build permits-2".into()]
            ),
            (
                "c".into(),
                vec!["api:github exclusive".into(), "slot:ci permits-3".into()]
            ),
        ]
    );
    assert_eq!(plan.tasks[1].label, "build");
    assert_eq!(plan.tasks[1].deps, ["a"]);
}

#[test]
fn bad_uses_clauses_are_refused_with_what_to_write() {
    for (text, want) in [
        ("!delegate\na: x [uses]", "`[uses]` names no resource"),
        (
            "!delegate\na: x [uses docs]",
            "needs a kind: write kind:name",
        ),
        ("!delegate\na: x [uses file:a//b]", "has an empty segment"),
        (
            "!delegate\na: x [uses slot:b permits]",
            "`permits` needs a number",
        ),
        (
            "!delegate\na: x [uses slot:b permits 0]",
            "use exclusive, shared or permits-N",
        ),
        (
            "!delegate\na: x [uses slot:b sometimes]",
            "use exclusive, shared or permits-N",
        ),
        (
            "!delegate\na: x [uses slot:b shared now]",
            "separate resources with commas",
        ),
        ("!delegate\na: x [uses api:x, api:x shared]", "named twice"),
        (
            "!delegate\na: x [uses api:x] [uses api:y]",
            "`[uses ...]` must come at the end",
        ),
    ] {
        let e = parse_delegate(text).expect_err(text).to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn uses_become_the_task_created_body_and_the_folded_task() {
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    let text = "!delegate\na: one [uses slot:build permits 2, file:src/**]";
    let command = signed_post(2, "lobby", None, "olga", text, &key);
    auth.apply(&command);
    let Some(Ok(parsed)) = owner_command_in(&command, auth.config(), &ParseContext::default())
    else {
        panic!("the signed command parses");
    };
    let rows = derived_rows(&command, &parsed, auth.config());
    assert_eq!(
        rows[0].body["uses"],
        serde_json::json!([
            {"name": "file:src/**", "mode": "exclusive"},
            {"name": "slot:build", "mode": "permits-2"}
        ])
    );
    let mut dag = crate::tasks::TaskDag::new();
    let mut ledger = crate::testing::Ledger::default();
    let row = ledger.push(rows[0].clone(), crate::model::Timestamp(3));
    crate::fold::Fold::apply(&mut dag, &row);
    let task = dag.task("lobby", "a").expect("folded");
    assert_eq!(task.uses.len(), 2);
    // A body naming a malformed resource is no task.
    let mut bad = rows[0].clone();
    bad.body["task"] = "b".into();
    bad.body["uses"] = serde_json::json!([{"name": "nokind", "mode": "exclusive"}]);
    let bad = ledger.push(bad, crate::model::Timestamp(4));
    crate::fold::Fold::apply(&mut dag, &bad);
    assert!(dag.task("lobby", "b").is_none());
}

/// A signed `!retry` / `!cancel` derives one admitted row per task; the same rows
/// hand-written are not admitted.
#[test]
fn retry_and_cancel_derive_admitted_rows_for_existing_tasks() {
    let key = owner_secret();
    let mut auth = OwnerAuthority::new();
    auth.apply(&created_with_key(1, "lobby", "olga", &key));
    let delegate = signed_post(
        2,
        "lobby",
        None,
        "olga",
        "!delegate\na: x\nb: y [after a]",
        &key,
    );
    auth.apply(&delegate);
    let Some(Ok(parsed)) = owner_command_in(&delegate, auth.config(), &ParseContext::default())
    else {
        panic!("the !delegate parses");
    };
    for (n, d) in derived_rows(&delegate, &parsed, auth.config())
        .into_iter()
        .enumerate()
    {
        auth.apply(&materialize(
            d,
            Position::new(0, 3 + n as u64),
            Timestamp(0),
        ));
    }
    let task_exists = |id: &str| auth.task_exists("lobby", id);
    let ctx = ParseContext {
        task_exists: &task_exists,
        ..ParseContext::default()
    };
    let retry = signed_post(10, "lobby", None, "olga", "!retry a, b", &key);
    let cancel = signed_post(11, "lobby", None, "olga", "!cancel a with dependants", &key);
    let unknown = signed_post(12, "lobby", None, "olga", "!cancel nope", &key);
    let Some(Err(e)) = owner_command_in(&unknown, auth.config(), &ctx) else {
        panic!("an unknown task is refused");
    };
    assert_eq!(
        e.to_string(),
        "nothing changed: room has no task `nope` (`huddle tasks` lists them)"
    );
    let mut derived = Vec::new();
    for c in [&retry, &cancel] {
        let Some(Ok(parsed)) = owner_command_in(c, auth.config(), &ctx) else {
            panic!("parses");
        };
        derived.extend(derived_rows(c, &parsed, auth.config()));
    }
    let verbs: Vec<(Verb, serde_json::Value)> =
        derived.iter().map(|d| (d.verb, d.body.clone())).collect();
    assert_eq!(
        verbs,
        vec![
            (Verb::TaskRetried, json!({"task": "a", "attempts": 3})),
            (Verb::TaskRetried, json!({"task": "b", "attempts": 3})),
            (
                Verb::TaskCancelled,
                json!({"task": "a", "dependants": true})
            ),
        ]
    );
    for c in [&retry, &cancel] {
        auth.apply(c);
    }
    for (n, d) in derived.iter().enumerate() {
        let r = materialize(d.clone(), Position::new(0, 20 + n as u64), Timestamp(0));
        assert!(auth.admits(&r), "{r:?}");
    }
    let mut forged = derived[2].clone();
    forged.parent = None;
    let r = materialize(forged, Position::new(0, 30), Timestamp(0));
    assert!(!auth.admits(&r), "a hand-written cancel is not admitted");
}
