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
            format!("(progress, not the reply) {text}")
        }
        (None, Some(text)) => text.to_string(),
        (None, None) => canonical_json(&i.body),
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

#[cfg(test)]
mod tests {
    use super::*;

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
