//! The `!config` parser.
//!
//! ```text
//! !config                          help
//! !config help [key]               the keys, or one key in detail
//! !config [room] get [key]         effective values and where they come from
//! !config [room] reset key...      clear keys (`all` clears every key)
//! !config [room] key value...      set one or more keys
//! ```
//!
//! Posted in a thread, `get`, `reset` and set apply to that thread; `room` forces
//! the room. The room-wide keys ([`ConfigKey::room_wide`]: who may write as whom,
//! which rows count) are refused in a thread without `room`, and `reset all` there
//! leaves them. The exact grammar is in `docs/protocol/commands.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::config::{
    ClampNote, ConfigFold, ConfigKey, ConfigSetBody, ConfigSource, UnknownKey, ValueError,
};
use crate::model::{InteractionId, NewInteraction, Role};
use crate::verbs::Verb;

use super::delegate::MAX_COMMAND_BYTES;

/// Where a `!config` applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigTarget {
    /// Where it was posted: the thread, or the room when posted outside a thread.
    Here,
    /// The room, even when posted in a thread (the `room` word).
    Room,
}

impl ConfigTarget {
    /// The thread a change lands in, given the thread the command was posted in.
    pub fn thread(self, posted_in: Option<&str>) -> Option<&str> {
        match self {
            ConfigTarget::Here => posted_in,
            ConfigTarget::Room => None,
        }
    }

    fn describe(self, posted_in: Option<&str>) -> &'static str {
        match self.thread(posted_in) {
            Some(_) => "this thread",
            None => "this room",
        }
    }
}

/// A parsed `!config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigCommand {
    /// `!config`, `!config help [key]`: reply with [`help_text`].
    Help {
        /// The key asked about, if any.
        key: Option<ConfigKey>,
    },
    /// `!config [room] get [key]`: reply with [`get_reply`].
    Get {
        /// Room or here.
        target: ConfigTarget,
        /// The key asked about; `None` is every key.
        key: Option<ConfigKey>,
    },
    /// A change: append [`ConfigChange::to_interaction`] and reply with
    /// [`ConfigChange::reply_text`].
    Change(ConfigChange),
}

/// Keys set and reset by one `!config`, already checked and clamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigChange {
    /// Room or here.
    pub target: ConfigTarget,
    /// The `config.set` body.
    pub body: ConfigSetBody,
    /// Values that were clamped into their range, to report back.
    pub notes: Vec<ClampNote>,
}

impl ConfigChange {
    /// The `config.set` interaction that records this change: by the owner, in the
    /// target scope, with the command message as parent. (The parent keeps two
    /// identical commands from being one interaction: setting `rate 5`, then
    /// `rate 6`, then `rate 5` again must append three rows.)
    pub fn to_interaction(
        &self,
        room: &str,
        posted_in_thread: Option<&str>,
        owner: &str,
        command_message: InteractionId,
    ) -> NewInteraction {
        let mut row = NewInteraction::new(
            room,
            Verb::ConfigSet,
            owner,
            Role::Owner,
            self.body.to_json(),
        )
        .with_parent(command_message);
        if let Some(t) = self.target.thread(posted_in_thread) {
            row = row.in_thread(t);
        }
        row
    }

    /// The reply confirming the change, including every clamp note.
    pub fn reply_text(&self, posted_in_thread: Option<&str>) -> String {
        let scope = self.target.describe(posted_in_thread);
        let mut out = String::new();
        if !self.body.set.is_empty() {
            let set: Vec<String> = self
                .body
                .set
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            let _ = write!(out, "Config for {scope}: {}.", set.join(", "));
        }
        if !self.body.reset.is_empty() {
            let reset: Vec<&str> = self.body.reset.iter().map(|k| k.as_str()).collect();
            let fallback = match self.target.thread(posted_in_thread) {
                Some(_) => "the room's value or the default",
                None => "the default",
            };
            if !out.is_empty() {
                out.push(' ');
            }
            let _ = write!(
                out,
                "Reset for {scope}: {} (back to {fallback}).",
                reset.join(", ")
            );
        }
        for note in &self.notes {
            let _ = write!(out, "\nNote: {note}.");
        }
        out
    }
}

/// Why a `!config` was rejected. Nothing of it is applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key that does not exist.
    #[error(transparent)]
    UnknownKey(#[from] UnknownKey),
    /// A value the key does not accept.
    #[error(transparent)]
    BadValue(#[from] ValueError),
    /// A key at the end with no value after it.
    #[error("`{key}` needs a value: {}", .key.expected())]
    MissingValue {
        /// The key.
        key: ConfigKey,
    },
    /// The same key twice in one command.
    #[error("`{key}` is given twice; give each key once")]
    DuplicateKey {
        /// The key.
        key: ConfigKey,
    },
    /// `reset` with no key.
    #[error("`reset` needs at least one key (or `all`), e.g. `!config reset rate`")]
    MissingKeys,
    /// Words after a complete `help` or `get`.
    #[error("unexpected `{token}` after `{after}`; see `!config help`")]
    Unexpected {
        /// What it followed.
        after: &'static str,
        /// The unexpected word (shortened).
        token: String,
    },
    /// `!config room` alone.
    #[error("`room` must be followed by `get`, `reset` or `key value`")]
    RoomNeedsMore,
    /// A room-wide key set or reset in a thread without `room`.
    #[error(
        "`{key}` applies to the whole room, not to one thread; post it outside a thread \
         or write `!config room ...`"
    )]
    RoomWide {
        /// The key.
        key: ConfigKey,
    },
    /// Several of the above in one command, in the order written; nothing is applied.
    #[error("{} errors:{}", .0.len(), .0.iter().map(|e| format!("\n- {e}")).collect::<String>())]
    Several(Vec<ConfigError>),
    /// The command is over the size limit.
    #[error("the command is {bytes} bytes; the limit is {max} bytes")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
}

/// Parses a `!config` message (the leading `!config` word is optional) posted outside
/// a thread; see [`parse_config_in`].
pub fn parse_config(message: &str) -> Result<ConfigCommand, ConfigError> {
    parse_config_in(message, None)
}

/// Parses a `!config` message posted in `thread` (`None`: in the room). In a thread, a
/// change without `room` may not name a room-wide key ([`ConfigKey::room_wide`]), and
/// `reset all` resets every other key.
pub fn parse_config_in(message: &str, thread: Option<&str>) -> Result<ConfigCommand, ConfigError> {
    if message.len() > MAX_COMMAND_BYTES {
        return Err(ConfigError::TooLarge {
            bytes: message.len(),
            max: MAX_COMMAND_BYTES,
        });
    }
    let trimmed = message.trim_start();
    let args = match trimmed.strip_prefix("!config") {
        Some(rest) if rest.is_empty() || rest.starts_with(char::is_whitespace) => rest,
        _ => trimmed,
    };
    let mut words = args.split_whitespace();
    let Some(first) = words.next() else {
        return Ok(ConfigCommand::Help { key: None });
    };
    if word_is(first, "help") {
        let key = optional_key(&mut words, "help")?;
        return Ok(ConfigCommand::Help { key });
    }
    let (target, verb) = if word_is(first, "room") {
        (
            ConfigTarget::Room,
            words.next().ok_or(ConfigError::RoomNeedsMore)?,
        )
    } else {
        (ConfigTarget::Here, first)
    };
    if word_is(verb, "get") {
        let key = optional_key(&mut words, "get")?;
        return Ok(ConfigCommand::Get { target, key });
    }
    let mut body = ConfigSetBody::default();
    // A change that lands in a thread may not touch the room-wide keys.
    let in_thread = target.thread(thread).is_some();
    if word_is(verb, "reset") {
        let mut errors = Vec::new();
        for word in words {
            if word_is(word, "all") {
                body.reset.extend(
                    ConfigKey::ALL
                        .into_iter()
                        .filter(|k| !(in_thread && k.room_wide())),
                );
                continue;
            }
            match parse_key(word) {
                Ok(key) if in_thread && key.room_wide() => {
                    errors.push(ConfigError::RoomWide { key });
                }
                Ok(key) if !body.reset.insert(key) => {
                    errors.push(ConfigError::DuplicateKey { key });
                }
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        if body.reset.is_empty() && errors.is_empty() {
            return Err(ConfigError::MissingKeys);
        }
        all_or_errors(errors)?;
        return Ok(ConfigCommand::Change(ConfigChange {
            target,
            body,
            notes: Vec::new(),
        }));
    }
    let mut notes = Vec::new();
    let mut set = BTreeMap::new();
    let mut errors = Vec::new();
    let mut words = std::iter::once(verb).chain(words).peekable();
    while let Some(word) = words.next() {
        let key = match parse_key(word) {
            Ok(key) => key,
            Err(e) => {
                errors.push(e);
                // The unknown key's value, unless the next word is a key itself, so
                // that the keys after it are still checked.
                words.next_if(|next| parse_key(next).is_err());
                continue;
            }
        };
        let Some(value) = words.next() else {
            errors.push(ConfigError::MissingValue { key });
            break;
        };
        if in_thread && key.room_wide() {
            errors.push(ConfigError::RoomWide { key });
            continue;
        }
        match key.parse_value(value) {
            Ok((value, note)) => {
                if set.insert(key, value).is_some() {
                    errors.push(ConfigError::DuplicateKey { key });
                }
                notes.extend(note);
            }
            Err(e) => errors.push(e.into()),
        }
    }
    all_or_errors(errors)?;
    body.set = set;
    Ok(ConfigCommand::Change(ConfigChange {
        target,
        body,
        notes,
    }))
}

/// Nothing when `errors` is empty, the error itself when it is one, else
/// [`ConfigError::Several`].
fn all_or_errors(mut errors: Vec<ConfigError>) -> Result<(), ConfigError> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(ConfigError::Several(errors)),
    }
}

fn word_is(word: &str, keyword: &str) -> bool {
    word.eq_ignore_ascii_case(keyword)
}

fn parse_key(word: &str) -> Result<ConfigKey, ConfigError> {
    Ok(word
        .to_ascii_lowercase()
        .parse::<ConfigKey>()
        .map_err(|mut e| {
            e.key = crate::config::shorten(word);
            e
        })?)
}

fn optional_key<'a>(
    words: &mut impl Iterator<Item = &'a str>,
    after: &'static str,
) -> Result<Option<ConfigKey>, ConfigError> {
    let key = words.next().map(parse_key).transpose()?;
    match words.next() {
        Some(extra) => Err(ConfigError::Unexpected {
            after,
            token: crate::config::shorten(extra),
        }),
        None => Ok(key),
    }
}

/// The reply to `!config help` (every key) or `!config help <key>`.
pub fn help_text(key: Option<ConfigKey>) -> String {
    let mut out = String::new();
    match key {
        Some(k) => {
            let _ = write!(
                out,
                "{k}: {}.\nDefault: {}. Accepts {}.",
                k.meaning(),
                k.default_value(),
                k.expected()
            );
        }
        None => {
            out.push_str(
                "!config (room owner only). In a thread it applies to the thread; `room` \
                 forces the room.\n\
                 !config help [key] | !config [room] get [key] | \
                 !config [room] reset <key...|all> | !config [room] <key> <value> [<key> <value>...]\n\
                 Keys:",
            );
            for k in ConfigKey::ALL {
                let _ = write!(
                    out,
                    "\n- {k} (default {}): {}. Accepts {}.",
                    k.default_value(),
                    k.meaning(),
                    k.expected()
                );
            }
        }
    }
    out
}

/// The reply to `!config [room] get [key]`: effective values and their source.
pub fn get_reply(
    fold: &ConfigFold,
    room: &str,
    posted_in_thread: Option<&str>,
    target: ConfigTarget,
    key: Option<ConfigKey>,
) -> String {
    let thread = target.thread(posted_in_thread);
    let settings = fold.explain(room, thread);
    let mut out = format!("Config for {}:", target.describe(posted_in_thread));
    for s in settings.iter().filter(|s| key.is_none_or(|k| k == s.key)) {
        let source = match s.source {
            ConfigSource::Default => "default",
            ConfigSource::Room if thread.is_some() => "from the room",
            ConfigSource::Room | ConfigSource::Thread => "set",
            ConfigSource::Topology => "from the topology",
        };
        let _ = write!(out, "\n- {} = {} ({source})", s.key, s.value);
    }
    out
}
