//! Fuzzes `!config` and the config fold: never panics, and every value read back is
//! inside its clamps, whatever the command or the `config.set` body.
#![no_main]

use huddle_core::commands::{parse_config, ConfigCommand};
use huddle_core::config::{ConfigFold, ConfigSetBody};
use huddle_core::{Fold, Interaction, NewInteraction, Position, Role, Timestamp, Verb};
use libfuzzer_sys::fuzz_target;

fn row(pos: u64, verb: Verb, body: serde_json::Value) -> Interaction {
    let n = NewInteraction::new("lobby", verb, "olga", Role::Owner, body);
    Interaction {
        id: n.id(),
        position: Position::new(0, pos),
        at: Timestamp(0),
        relay: "fuzz".into(),
        room: n.room,
        thread: n.thread,
        verb: n.verb,
        actor: n.actor,
        role: n.role,
        parent: None,
        caused_by: Vec::new(),
        body: n.body,
        signer: None,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut fold = ConfigFold::new();
    fold.apply(&row(
        1,
        Verb::RoomCreated,
        serde_json::json!({"owner": "olga"}),
    ));

    // As a command typed in chat.
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(ConfigCommand::Change(change)) = parse_config(text) {
            let body = change.body.to_json();
            assert_eq!(ConfigSetBody::from_json(&body).as_ref(), Ok(&change.body));
            fold.apply(&row(2, Verb::ConfigSet, body));
            let _ = change.reply_text(Some("t"));
        }
    }
    // As a hand-written config.set body.
    if let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) {
        fold.apply(&row(3, Verb::ConfigSet, body));
    }
    assert!(fold.effective("lobby", None).is_within_clamps());
    assert!(fold.effective("lobby", Some("t")).is_within_clamps());
});
