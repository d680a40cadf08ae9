//! Who a message is addressed to: mentions, then reply-to, then broadcast.
//!
//! Addressing reads text only to find `@name` mentions of known agents; it never
//! interprets text as an instruction.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::Role;

/// To whom a message is addressed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Addressing {
    /// It mentions these known agents (sorted).
    Mentioned(Vec<String>),
    /// It replies (via `parent`) to a message of this agent.
    ReplyTo(String),
    /// It replies to a message of someone who is not an agent (a person, huddle
    /// itself): a conversation between people, which no agent answers unless named.
    ReplyToPerson,
    /// Nobody in particular.
    Broadcast,
}

/// Who may answer a message.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Eligible {
    /// Every agent in the room except the author.
    Everyone {
        /// The author, who never answers itself.
        except: String,
    },
    /// Exactly these agents (sorted; never the author).
    Agents(Vec<String>),
}

impl Eligible {
    /// Whether `agent` may answer.
    pub fn contains(&self, agent: &str) -> bool {
        match self {
            Eligible::Everyone { except } => except != agent,
            Eligible::Agents(list) => list.iter().any(|a| a == agent),
        }
    }

    /// Whether nobody may answer.
    pub fn is_nobody(&self) -> bool {
        matches!(self, Eligible::Agents(list) if list.is_empty())
    }

    /// Whether each eligible agent answers once (the message names several agents),
    /// rather than one of them answering for all.
    pub fn answers_each(&self) -> bool {
        matches!(self, Eligible::Agents(list) if list.len() >= 2)
    }
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

/// The known agents that `text` mentions as `@agent`, sorted. A mention must not be
/// preceded by a name character (so `ana@example.com` mentions nobody) and must end at
/// the end of the text or before a character that cannot continue a name (so `@bob`
/// does not mention `bo`).
pub fn mentions_in(text: &str, known: &BTreeSet<String>) -> Vec<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices('@') {
        // `@@cap` is a group mention ([`group_mentions_in`]), not a mention of `cap`.
        if text[..i]
            .chars()
            .next_back()
            .is_some_and(|c| is_name_char(c) || c == '@')
            || text[i + 1..].starts_with('@')
        {
            continue;
        }
        let rest = &text[i + 1..];
        for agent in known {
            if let Some(after) = rest.strip_prefix(agent.as_str()) {
                if !after.chars().next().is_some_and(is_name_char) {
                    found.insert(agent.clone());
                }
            }
        }
    }
    found.into_iter().collect()
}

/// The capabilities `text` mentions as a group, `@@cap` (not preceded by a name
/// character; the capability runs to the first character that cannot continue a
/// name), sorted.
pub fn group_mentions_in(text: &str) -> Vec<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text.match_indices("@@") {
        if text[..i]
            .chars()
            .next_back()
            .is_some_and(|c| is_name_char(c) || c == '@')
        {
            continue;
        }
        let cap: String = text[i + 2..]
            .chars()
            .take_while(|c| is_name_char(*c) || *c == '.' || *c == ':')
            .collect();
        let cap = cap.trim_end_matches(['.', ':']).to_string();
        if !cap.is_empty() {
            found.insert(cap);
        }
    }
    found.into_iter().collect()
}

/// [`address`] in a room whose registered agents have these capabilities: a group
/// mention `@@cap` names every registered agent with capability `cap` (each of them
/// answers once, like several names).
pub fn address_in_room(
    text: &str,
    explicit_mentions: &[String],
    parent_author: Option<&str>,
    agents: &BTreeMap<String, Vec<String>>,
) -> Addressing {
    let known: BTreeSet<String> = agents.keys().cloned().collect();
    let groups = group_mentions_in(text);
    if groups.is_empty() {
        return address(text, explicit_mentions, parent_author, &known);
    }
    let mut named: Vec<String> = explicit_mentions.to_vec();
    named.extend(
        agents
            .iter()
            .filter(|(_, caps)| caps.iter().any(|c| groups.contains(c)))
            .map(|(a, _)| a.clone()),
    );
    match address(text, &named, parent_author, &known) {
        // A group with no member is addressed to nobody, not to everyone.
        Addressing::Mentioned(list) => Addressing::Mentioned(list),
        _ => Addressing::Mentioned(Vec::new()),
    }
}

/// Whether a message names agents only through `@@cap` groups: it has a group mention
/// and neither explicit mentions nor `@agent` mentions of `known` agents. Under
/// `group-reply one` such a message is answered once, by one member of the group.
pub fn group_only(text: &str, explicit_mentions: &[String], known: &BTreeSet<String>) -> bool {
    !group_mentions_in(text).is_empty()
        && explicit_mentions.iter().all(|m| !known.contains(m))
        && mentions_in(text, known).is_empty()
}

/// Whether each eligible agent answers a message once: it names several agents, and
/// it is not a group-only message under `group-reply one` (see [`group_only`]).
pub fn answers_each(
    eligible: &Eligible,
    text: &str,
    explicit_mentions: &[String],
    known: &BTreeSet<String>,
    group_reply: crate::config::GroupReply,
) -> bool {
    eligible.answers_each()
        && !(group_reply == crate::config::GroupReply::One
            && group_only(text, explicit_mentions, known))
}

/// How a message is addressed: explicit `mentions` (from the adapter) and `@agent` in
/// its text, then the author of its parent message (an agent, or a person: then no
/// agent), then broadcast. Only `known` agents count. `parent_author` is `None` when
/// the message has no parent (or its author is no longer remembered).
pub fn address(
    text: &str,
    explicit_mentions: &[String],
    parent_author: Option<&str>,
    known: &BTreeSet<String>,
) -> Addressing {
    let mut mentioned: BTreeSet<String> = explicit_mentions
        .iter()
        .filter(|m| known.contains(*m))
        .cloned()
        .collect();
    mentioned.extend(mentions_in(text, known));
    if !mentioned.is_empty() {
        return Addressing::Mentioned(mentioned.into_iter().collect());
    }
    match parent_author {
        Some(a) if known.contains(a) => Addressing::ReplyTo(a.to_string()),
        Some(_) => Addressing::ReplyToPerson,
        None => Addressing::Broadcast,
    }
}

/// Whether a message from `role` with this text is an owner command meant for huddle
/// (`!delegate`, `!config`, `!approve`, `!deny`, `!stop`) rather than for the agents. Only the prefix is looked at;
/// commands are parsed (and only the owner's executed) elsewhere.
pub fn is_command_text(text: &str) -> bool {
    crate::commands::command_word(text).is_some()
}

/// Who may answer a message, given its author and addressing.
///
/// - Messages from agents and from huddle (`agent`, `system`) are answered only by
///   agents they explicitly mention: an agent's broadcast or reply never wakes the
///   others by itself, which stops reply loops at the source.
/// - With `require_mention`, only mentions count.
/// - Owner commands are for huddle, not the agents: nobody answers them.
/// - Nobody answers their own message.
pub fn eligible(
    author: &str,
    role: Role,
    text: &str,
    addressing: &Addressing,
    require_mention: bool,
) -> Eligible {
    let nobody = Eligible::Agents(Vec::new());
    if matches!(role, Role::Owner | Role::Human) && is_command_text(text) {
        return nobody;
    }
    let only_mentions = require_mention || matches!(role, Role::Agent | Role::System);
    match addressing {
        Addressing::Mentioned(list) => Eligible::Agents(
            list.iter()
                .filter(|a| a.as_str() != author)
                .cloned()
                .collect(),
        ),
        _ if only_mentions => nobody,
        Addressing::ReplyTo(a) if a != author => Eligible::Agents(vec![a.clone()]),
        Addressing::ReplyTo(_) | Addressing::ReplyToPerson => nobody,
        Addressing::Broadcast => Eligible::Everyone {
            except: author.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> BTreeSet<String> {
        ["bo", "bob", "cy", "dee.x"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn mentions_are_found_at_word_boundaries() {
        let cases: &[(&str, &[&str])] = &[
            ("@bo hi", &["bo"]),
            ("hi @bob", &["bob"]),
            ("@bo, @cy: both", &["bo", "cy"]),
            ("mail ana@bo please", &[]),
            ("@bobby", &[]),
            ("@dee.x.", &["dee.x"]),
            ("(@cy)", &["cy"]),
            ("@", &[]),
            ("@@bo", &[]), // a group mention (of capability bo), not the agent
            ("naïve@bo", &[]),
        ];
        for (text, want) in cases {
            let got = mentions_in(text, &known());
            assert_eq!(got, want.to_vec(), "{text}");
        }
    }

    #[test]
    fn group_mentions_name_every_agent_with_the_capability() {
        assert_eq!(
            group_mentions_in("@@review: and @@ops, not x@@y"),
            vec!["ops", "review"]
        );
        // `@@bo` is a group, never a mention of the agent bo.
        assert!(mentions_in("@@bo look", &known()).is_empty());
        let agents: BTreeMap<String, Vec<String>> = [
            ("bo", vec!["review"]),
            ("cy", vec!["review", "rust"]),
            ("dee", vec![]),
        ]
        .iter()
        .map(|(a, c)| (a.to_string(), c.iter().map(|c| c.to_string()).collect()))
        .collect();
        let to = |text: &str| address_in_room(text, &[], None, &agents);
        assert_eq!(
            to("@@review please"),
            Addressing::Mentioned(vec!["bo".into(), "cy".into()])
        );
        assert_eq!(
            to("@@rust and @dee"),
            Addressing::Mentioned(vec!["cy".into(), "dee".into()])
        );
        assert_eq!(to("@@nobody hello"), Addressing::Mentioned(vec![]));
        let known: BTreeSet<String> = agents.keys().cloned().collect();
        assert!(group_only("@@review please", &[], &known));
        assert!(!group_only("@@review and @dee", &[], &known));
        assert!(!group_only("@@review", &["bo".to_string()], &known));
        assert!(!group_only("@dee", &[], &known));
        let e = eligible("hank", Role::Human, "x", &to("@@review please"), false);
        use crate::config::GroupReply;
        assert!(answers_each(
            &e,
            "@@review please",
            &[],
            &known,
            GroupReply::Each
        ));
        assert!(!answers_each(
            &e,
            "@@review please",
            &[],
            &known,
            GroupReply::One
        ));
        let e2 = eligible("hank", Role::Human, "x", &to("@@rust and @dee"), false);
        assert!(answers_each(
            &e2,
            "@@rust and @dee",
            &[],
            &known,
            GroupReply::One
        ));
        assert_eq!(to("plain"), Addressing::Broadcast);
        let e = eligible("bo", Role::Agent, "x", &to("@@review"), false);
        assert_eq!(e, Eligible::Agents(vec!["cy".into()]), "never the author");
    }

    #[test]
    fn addressing_prefers_mentions_then_reply_to_then_broadcast() {
        let k = known();
        let cases = [
            (
                "@cy look",
                vec![],
                Some("bo"),
                Addressing::Mentioned(vec!["cy".into()]),
            ),
            (
                "x",
                vec!["bo".to_string()],
                None,
                Addressing::Mentioned(vec!["bo".into()]),
            ),
            ("x", vec!["zed".to_string()], None, Addressing::Broadcast),
            ("x", vec![], Some("bo"), Addressing::ReplyTo("bo".into())),
            ("x", vec![], Some("ana"), Addressing::ReplyToPerson),
            (
                "@cy x",
                vec![],
                Some("ana"),
                Addressing::Mentioned(vec!["cy".into()]),
            ),
            ("@zed x", vec![], None, Addressing::Broadcast),
        ];
        for (text, explicit, parent, want) in cases {
            assert_eq!(address(text, &explicit, parent, &k), want, "{text}");
        }
        // A reply to a person's message wakes no agent, whoever writes it.
        for role in [Role::Human, Role::Owner, Role::Agent] {
            let e = eligible("hank", role, "sure", &Addressing::ReplyToPerson, false);
            assert!(e.is_nobody(), "{role:?}");
        }
    }

    #[test]
    fn eligibility_table() {
        let bcast = Addressing::Broadcast;
        let reply_bo = Addressing::ReplyTo("bo".into());
        let m_bo = Addressing::Mentioned(vec!["bo".into()]);
        let everyone = |a: &str| Eligible::Everyone { except: a.into() };
        let only = |a: &[&str]| Eligible::Agents(a.iter().map(|s| s.to_string()).collect());
        let cases = [
            ("ana", Role::Human, "hi", &bcast, false, everyone("ana")),
            ("ana", Role::Human, "hi", &bcast, true, only(&[])),
            ("ana", Role::Human, "hi", &reply_bo, false, only(&["bo"])),
            ("ana", Role::Human, "hi", &reply_bo, true, only(&[])),
            (
                "ana",
                Role::Owner,
                "!delegate a: b",
                &m_bo,
                false,
                only(&[]),
            ),
            ("ana", Role::Owner, "!config get", &bcast, false, only(&[])),
            (
                "ana",
                Role::Owner,
                "!configure me",
                &bcast,
                false,
                everyone("ana"),
            ),
            ("cy", Role::Agent, "hi", &bcast, false, only(&[])),
            ("cy", Role::Agent, "hi", &reply_bo, false, only(&[])),
            ("cy", Role::Agent, "@bo hi", &m_bo, false, only(&["bo"])),
            ("bo", Role::Agent, "@bo hi", &m_bo, false, only(&[])),
            ("huddle", Role::System, "x", &bcast, false, only(&[])),
        ];
        for (author, role, text, addr, req, want) in cases {
            assert_eq!(
                eligible(author, role, text, addr, req),
                want,
                "{author} {text}"
            );
        }
    }
}
