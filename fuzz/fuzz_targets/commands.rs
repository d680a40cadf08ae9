//! Fuzzes every owner command word and message addressing: parsing never panics, a
//! parsed `!stop` names a valid agent and thread, and addressing only ever names
//! agents it knows, never the author, with one reply claim per named agent exactly
//! when it names several.
#![no_main]

use std::collections::BTreeSet;

use huddle_core::commands::{owner_command_with, OwnerCommand, ParseContext};
use huddle_core::protocol::reply_key_for;
use huddle_core::sync::addressing::{address, eligible, Eligible};
use huddle_core::{InteractionId, Role};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ctx = ParseContext {
        thread: Some("t1"),
        ..ParseContext::default()
    };
    if let Some(Ok(OwnerCommand::Stop(stop))) = owner_command_with(Role::Owner, text, &ctx) {
        assert!(stop.thread.is_some(), "a !stop in a thread defaults to it");
        if let Some(a) = &stop.agent {
            assert!(!a.is_empty() && !a.contains('@') && !a.contains(char::is_whitespace));
        }
        let _ = stop.reply_text("lobby");
    }
    let known: BTreeSet<String> = ["ada", "bo", "cy", "bob"].iter().map(|s| s.to_string()).collect();
    for parent in [None, Some("ada"), Some("hank")] {
        let to = address(text, &[], parent, &known);
        for role in [Role::Human, Role::Owner, Role::Agent] {
            let e = eligible("ada", role, text, &to, false);
            if let Eligible::Agents(list) = &e {
                assert!(list.iter().all(|a| known.contains(a) && a != "ada"));
                let m = InteractionId([1; 32]);
                let keys: BTreeSet<String> = list
                    .iter()
                    .map(|a| reply_key_for("lobby", &m, a, e.answers_each()))
                    .collect();
                assert_eq!(keys.len(), if e.answers_each() { list.len() } else { list.len().min(1) });
            }
        }
    }
});
