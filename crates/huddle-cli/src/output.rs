//! Text forms of ledger rows for the terminal.

use huddle_core::{canonical::canonical_json, Interaction, Timestamp};

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC).
pub fn format_time(at: Timestamp) -> String {
    let micros = at.as_micros();
    let secs = micros.div_euclid(1_000_000);
    let millis = micros.rem_euclid(1_000_000) / 1_000;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{millis:03}",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    )
}

/// One line for a row: time, place, who, verb and the message text or the body.
pub fn line(i: &Interaction) -> String {
    let place = match &i.thread {
        Some(t) => format!("{}#{}", i.room, t),
        None => i.room.clone(),
    };
    let heartbeat = (i.verb == huddle_core::Verb::RelayHeartbeat)
        .then(|| huddle_core::protocol::RelayHeartbeatBody::parse(&i.body))
        .flatten();
    let what = match (heartbeat, i.body.get("text").and_then(|t| t.as_str())) {
        (Some(h), _) => format!(
            "relay {} beat {} (version {}, {} behind) hosts {}",
            h.relay,
            h.beat,
            h.version,
            h.behind,
            if h.agents.is_empty() {
                "no agents".to_string()
            } else {
                h.agents.join(", ")
            }
        ),
        (None, Some(text)) if i.verb == huddle_core::Verb::TurnProgress => {
            format!("(progress, not the reply) {}", indented(text))
        }
        (None, Some(text)) => indented(text),
        (None, None) => summary(&i.body),
    };
    format!(
        "{} {} {} ({}) {}: {}",
        format_time(i.at),
        place,
        i.actor,
        i.role,
        i.verb,
        what
    )
}

/// Longest string field a summary shows whole.
const FIELD_CHARS: usize = 100;

/// Text for the terminal: control characters (terminal escapes, carriage returns)
/// shown as `\u{..}` escapes, so a row can never drive the reader's terminal; a
/// multi-line text has its continuation lines indented under the first.
pub fn indented(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.trim_end_matches('\n').chars() {
        match c {
            '\n' => out.push_str("\n    "),
            '\t' => out.push('\t'),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
}

/// A bookkeeping row's body on one line: its top-level fields as `key=value` (long
/// strings cut, lists of up to five scalars joined, anything nested as `{…}`), in key
/// order. Not JSON: `tail --json` is the faithful form.
pub fn summary(body: &serde_json::Value) -> String {
    use serde_json::Value;
    fn scalar(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => {
                let one_line = s.replace('\n', " ");
                let cut: String = one_line.chars().take(FIELD_CHARS).collect();
                Some(if cut.len() < one_line.len() {
                    format!("{cut}…")
                } else {
                    cut
                })
            }
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Null => Some("null".into()),
            _ => None,
        }
    }
    let Value::Object(map) = body else {
        return canonical_json(body);
    };
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    let fields: Vec<String> = keys
        .into_iter()
        .map(|k| {
            let v = &map[k];
            let shown = scalar(v).unwrap_or_else(|| match v {
                Value::Array(a) if a.is_empty() => "[]".into(),
                Value::Array(a) if a.len() <= 5 && a.iter().all(|x| scalar(x).is_some()) => {
                    a.iter().filter_map(scalar).collect::<Vec<_>>().join(",")
                }
                Value::Array(a) => format!("[{} items]", a.len()),
                _ => "{…}".into(),
            });
            format!("{}={}", indented(k), indented(&shown))
        })
        .collect();
    fields.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_one_line_and_escape_control_characters() {
        let body = serde_json::json!({
            "task": "k1",
            "epoch": 3,
            "result": format!("first\nsecond {}", "x".repeat(200)),
            "after": ["a", "b"],
            "nested": {"x": 1},
            "evil": "\u{1b}[31mred",
        });
        let s = summary(&body);
        assert!(!s.contains('\n') && !s.contains('\u{1b}'), "{s}");
        assert!(
            s.starts_with("after=a,b epoch=3 evil=\\u{1b}[31mred nested={…}"),
            "{s}"
        );
        assert!(
            s.contains("result=first second xxx") && s.ends_with("… task=k1"),
            "{s}"
        );
        assert_eq!(indented("one\ntwo\n"), "one\n    two");
        assert_eq!(indented("bell\u{7}"), "bell\\u{7}");
    }

    #[test]
    fn times_are_utc_civil() {
        assert_eq!(format_time(Timestamp(0)), "1970-01-01 00:00:00.000");
        assert_eq!(
            format_time(Timestamp(951_782_400_123_456)),
            "2000-02-29 00:00:00.123"
        );
        assert_eq!(
            format_time(Timestamp(1_796_000_000_000_000)),
            "2026-11-30 00:53:20.000"
        );
    }
}
