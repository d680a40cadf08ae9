//! [`AgentSession`]: one agent in one room, over a store. The folds it keeps and the
//! operations that only read or post; the task operations are in [`crate::tasks`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use huddle_core::config::check_agent_name;
use huddle_core::protocol::{nonce_from, reply_key_for, AgentRegisteredBody, MessageBody};
use huddle_core::sync::addressing;
use huddle_core::{
    validate_name, Board, ClaimEpoch, ConfigFold, Fold, Interaction, InteractionId, NewInteraction,
    OwnerAuthority, Position, Role, TaskDag, Verb,
};
use huddle_store::{Acquired, Fence, Store, StoreError};
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

use crate::error::{AgentError, Result};
use crate::patterns::Patterns;
use crate::views::{
    written, BoardResult, InteractionView, PostArgs, ReadArgs, ReadResult, SummaryView, Written,
};

/// How long an agent holds a message's reply claim between taking it and writing the
/// reply (one call: the write follows at once and closes the claim).
const REPLY_LEASE: Duration = Duration::from_secs(30);

/// Rows per read-forward page.
const PAGE: usize = 1000;
/// The longest a catch-up waits for committed rows held back behind another
/// writer's open transaction (see [`huddle_store::ReadBatch::held_back`]).
const HELD_BACK_WAIT: Duration = Duration::from_secs(1);
/// Default and largest `limit` of `read`.
const READ_DEFAULT: u32 = 50;
const READ_MAX: u32 = 500;
/// The longest any call waits (`wait_ms`).
pub const MAX_WAIT_MS: u64 = 60_000;

/// The folded state of the session's room, and how far it has read.
pub(crate) struct Folded {
    pub(crate) cursor: Position,
    pub(crate) dag: TaskDag,
    /// Owners, keys and config: which owner rows count ([`OwnerAuthority`]); the
    /// task DAG sees only the `task.created` rows a signed owner command produced.
    pub(crate) authority: OwnerAuthority,
    pub(crate) board: Board,
    /// Epochs of the claims this session took, by task: what a write presents when
    /// the call gives none, so a stale write is refused by its fence, not guessed.
    pub(crate) mine: BTreeMap<String, ClaimEpoch>,
    /// Decisions, barriers and leases ([`crate::patterns`]).
    pub(crate) patterns: Patterns,
    /// Recent messages per thread, for `read`'s `<thread>` block.
    pub(crate) threads: huddle_core::thread::ThreadWindow,
    /// When this session last claimed or renewed each task it holds: the watchdog
    /// fails a task silent for the room's `stall-timeout` ([`crate::watch`]).
    pub(crate) activity: BTreeMap<String, Instant>,
}

impl Folded {
    /// The room's config as the owner's verified commands set it.
    pub(crate) fn config(&self) -> &ConfigFold {
        self.authority.config()
    }
}

/// One agent acting in one room. The agent's identity is fixed here: no operation
/// takes an actor from its arguments, so an agent cannot speak as another.
///
/// Every operation first reads the ledger forward from the session's cursor (what is
/// new since the last call), so it decides on the room as it is now.
pub struct AgentSession {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) room: String,
    pub(crate) agent: String,
    pub(crate) capabilities: Vec<String>,
    pub(crate) state: Mutex<Folded>,
    /// Progress notes this session wrote (their `seq`).
    pub(crate) progress_notes: std::sync::atomic::AtomicU32,
    /// Resources this session acquired and keeps alive ([`crate::resources`]).
    pub(crate) kept: crate::resources::Kept,
}

impl AgentSession {
    /// Opens a session for `agent` in `room`: checks the names, reads the room, and
    /// registers the agent (`agent.registered` with its capabilities; the same content
    /// again is a no-op). Fails when the room does not exist, when its owner bound
    /// the agent to writers other than this store's ([`Store::writer`]), or when the
    /// room would ignore this store's rows (it requires signatures, or registers keys
    /// for this writer, and the store does not sign with one: [`Store::signer`]).
    pub async fn open(
        store: Arc<dyn Store>,
        room: &str,
        agent: &str,
        mut capabilities: Vec<String>,
    ) -> Result<Self> {
        validate_name("room", room, store.limits())
            .map_err(|e| AgentError::BadArgument(e.to_string()))?;
        check_agent_name(agent).map_err(AgentError::BadArgument)?;
        capabilities.sort();
        capabilities.dedup();
        if let Some(bad) = capabilities
            .iter()
            .find(|c| !huddle_core::tasks::valid_capability(c))
        {
            return Err(AgentError::BadArgument(format!(
                "capability {bad:?}: 1 to 64 bytes, no white space"
            )));
        }
        let session = AgentSession {
            store,
            room: room.to_string(),
            agent: agent.to_string(),
            capabilities,
            state: Mutex::new(Folded {
                cursor: Position::START,
                dag: TaskDag::new(),
                authority: OwnerAuthority::new(),
                board: Board::new(),
                mine: BTreeMap::new(),
                patterns: Patterns::new(),
                threads: Default::default(),
                activity: BTreeMap::new(),
            }),
            progress_notes: std::sync::atomic::AtomicU32::new(0),
            kept: Default::default(),
        };
        {
            let st = session.synced().await?;
            if st.config().owner(room).is_none() {
                return Err(AgentError::NoRoom(room.to_string()));
            }
            // Refuse to act as an agent the owner bound to other writers: every
            // reader would ignore what this session writes.
            if let Some(writer) = session.store.writer() {
                let config = st.config().effective(room, None);
                huddle_core::config::refusal(&config, room, agent, &writer)?;
                let signer = session.store.signer();
                huddle_core::config::binding::signing_refusal(
                    &config,
                    room,
                    &writer,
                    signer.as_ref(),
                )?;
            }
        }
        let body = AgentRegisteredBody {
            capabilities: session.capabilities.clone(),
            priority: None,
        };
        session
            .store
            .append(vec![NewInteraction::new(
                room,
                Verb::AgentRegistered,
                agent,
                Role::Agent,
                serde_json::to_value(&body).unwrap_or_default(),
            )])
            .await?;
        Ok(session)
    }

    /// The agent this session speaks for.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The room.
    pub fn room(&self) -> &str {
        &self.room
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The end of the room now, as a `read` cursor: what comes after it is new.
    pub async fn cursor(&self) -> Result<String> {
        Ok(self.synced().await?.cursor.to_string())
    }

    /// The state, read forward to the end of the ledger.
    pub(crate) async fn synced(&self) -> Result<MutexGuard<'_, Folded>> {
        let mut st = self.state.lock().await;
        self.catch_up(&mut st).await?;
        Ok(st)
    }

    /// Reads forward from the cursor until nothing more is readable, and nothing
    /// committed is held back (read-your-writes across processes: a row this agent's
    /// previous command committed may sit behind another writer's open transaction
    /// for a moment). Waits for held-back rows up to [`HELD_BACK_WAIT`].
    pub(crate) async fn catch_up(&self, st: &mut Folded) -> Result<()> {
        let mut waited_since: Option<Instant> = None;
        loop {
            let batch = self.store.read_room(&self.room, st.cursor, PAGE).await?;
            if batch.rows.is_empty() && batch.skipped.is_empty() && batch.held_back {
                let since = *waited_since.get_or_insert_with(Instant::now);
                if since.elapsed() < HELD_BACK_WAIT {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
            }
            for row in &batch.rows {
                st.threads.observe(row);
                st.authority.apply(row);
                if st.authority.admits(row) {
                    st.dag.apply(row);
                    st.board.apply(row);
                    st.patterns.apply(row);
                }
            }
            if batch.next == st.cursor {
                return Ok(());
            }
            st.cursor = batch.next;
        }
    }

    /// Waits until the store's doorbell rings, the fallback poll is due, or
    /// `deadline`. Returns false once the deadline has passed.
    pub(crate) async fn wait_for_news(&self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let mut bell = self.store.doorbell();
        bell.borrow_and_update();
        let nap = self.store.poll_interval().min(deadline - now);
        tokio::select! {
            _ = bell.changed() => {}
            _ = tokio::time::sleep(nap) => {}
        }
        true
    }

    /// The namespaced idempotency key of this agent's write.
    pub(crate) fn idempotency(&self, key: Option<&str>) -> Result<Option<String>> {
        match key {
            None => Ok(None),
            Some(k) if k.is_empty() || k.len() > 200 => Err(AgentError::BadArgument(
                "idempotency_key must be 1 to 200 bytes".into(),
            )),
            Some(k) => Ok(Some(format!("agent/{}/{}/{k}", self.room, self.agent))),
        }
    }

    /// Appends rows written by this agent (no fence).
    pub(crate) async fn append_own(&self, row: NewInteraction) -> Result<Written> {
        let out = self.store.append(vec![row]).await?;
        self.store.flush().await;
        written(&out)
    }

    /// `read`: the room's interactions after a cursor (or the newest `limit`),
    /// optionally one thread, waiting up to `wait_ms` for something new; with the
    /// thread's `<thread>` block (what was said there since this agent last spoke).
    pub async fn read(&self, args: ReadArgs) -> Result<ReadResult> {
        let thread = args.thread.clone();
        let mut result = self.read_rows(args).await?;
        let st = self.synced().await?;
        let budget = st
            .config()
            .effective(&self.room, thread.as_deref())
            .thread_context_bytes as usize;
        result.thread_context =
            st.threads
                .block(&self.room, thread.as_deref(), &self.agent, None, budget);
        Ok(result)
    }

    async fn read_rows(&self, args: ReadArgs) -> Result<ReadResult> {
        let limit = args.limit.unwrap_or(READ_DEFAULT).clamp(1, READ_MAX) as usize;
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
        let deadline = Instant::now() + wait;
        let after = match args.after.as_deref() {
            Some(c) => Some(c.parse::<Position>().map_err(|_| {
                AgentError::BadArgument(format!(
                    "cursor {c:?} is not one `read` returned (it looks like `0:42`)"
                ))
            })?),
            None => None,
        };
        let keep = |r: &huddle_core::Interaction| {
            args.thread.is_none() || r.thread.as_deref() == args.thread.as_deref()
        };
        let Some(mut cursor) = after else {
            // The newest `limit`: read the room through, keep the tail.
            let mut tail: VecDeque<InteractionView> = VecDeque::new();
            let mut cursor = Position::START;
            loop {
                let batch = self.store.read_room(&self.room, cursor, PAGE).await?;
                for r in batch.rows.iter().filter(|r| keep(r)) {
                    if tail.len() == limit {
                        tail.pop_front();
                    }
                    tail.push_back(r.into());
                }
                if batch.next == cursor {
                    break;
                }
                cursor = batch.next;
            }
            return Ok(ReadResult {
                interactions: tail.into(),
                next: cursor.to_string(),
                thread_context: None,
            });
        };
        loop {
            let mut out = Vec::new();
            loop {
                let batch = self.store.read_room(&self.room, cursor, limit).await?;
                let mut last = None;
                for r in &batch.rows {
                    if out.len() == limit {
                        break;
                    }
                    last = Some(r.position);
                    if keep(r) {
                        out.push(InteractionView::from(r));
                    }
                }
                let full = out.len() == limit;
                // Stop the cursor at the last row returned when the page was cut.
                let next = if full {
                    last.unwrap_or(batch.next)
                } else {
                    batch.next
                };
                let moved = next != cursor;
                cursor = next;
                if full || !moved {
                    break;
                }
            }
            if !out.is_empty() || !self.wait_for_news(deadline).await {
                return Ok(ReadResult {
                    interactions: out,
                    next: cursor.to_string(),
                    thread_context: None,
                });
            }
        }
    }

    /// `post`: a message, or a reply when `reply_to` names the message answered.
    pub async fn post(&self, args: PostArgs) -> Result<Written> {
        if args.text.trim().is_empty() {
            return Err(AgentError::BadArgument("text is empty".into()));
        }
        if args.progress {
            return self.progress_note(args).await;
        }
        let mut mentions = args.mentions.clone();
        mentions.sort();
        mentions.dedup();
        if let Some(bad) = mentions.iter().find(|m| check_agent_name(m).is_err()) {
            return Err(AgentError::BadArgument(format!(
                "mention {bad:?} is not an agent name"
            )));
        }
        // Every post is a new message, however often its text was said before: a
        // nonce from the idempotency key (a retry is the same row), the message
        // replied to (an agent answers a message once), or fresh randomness.
        let nonce = match (&args.idempotency_key, &args.reply_to) {
            (Some(k), _) => nonce_from(format!("key\0{}\0{k}", self.agent).as_bytes()),
            (None, Some(p)) => nonce_from(format!("reply\0{}\0{p}", self.agent).as_bytes()),
            (None, None) => {
                let mut seed = [0u8; 16];
                getrandom::fill(&mut seed).map_err(|e| {
                    AgentError::BadArgument(format!("no randomness for the post's nonce: {e}"))
                })?;
                nonce_from(&seed)
            }
        };
        let body = MessageBody {
            text: args.text,
            mentions,
            nonce: Some(nonce),
            ..MessageBody::default()
        };
        let mut row = NewInteraction::new(
            self.room.as_str(),
            Verb::MessagePosted,
            self.agent.as_str(),
            Role::Agent,
            serde_json::to_value(&body).unwrap_or_default(),
        );
        if let Some(t) = args.thread {
            validate_name("thread", &t, self.store.limits())
                .map_err(|e| AgentError::BadArgument(e.to_string()))?;
            row = row.in_thread(t);
        }
        let mut each = false;
        if let Some(p) = args.reply_to.as_deref() {
            let id: InteractionId = p.parse().map_err(|_| {
                AgentError::BadArgument(format!(
                    "reply_to {p:?} is not an interaction id (64 hex digits)"
                ))
            })?;
            match self.store.get(id).await? {
                Some(m) if m.room == self.room => {
                    each = self.names_several(&m).await?;
                    row = row.with_parent(id)
                }
                _ => {
                    return Err(AgentError::BadArgument(format!(
                        "reply_to {p}: no such interaction in this room"
                    )))
                }
            }
        }
        if let Some(k) = self.idempotency(args.idempotency_key.as_deref())? {
            row = row.with_idempotency_key(k);
        }
        match row.parent {
            Some(parent) => self.reply(parent, each, row).await,
            None => self.append_own(row).await,
        }
    }

    /// Whether `message` names several agents, this one among them: then each of
    /// them answers it once, under its own reply claim, as relays do.
    pub(crate) async fn names_several(&self, message: &Interaction) -> Result<bool> {
        let body: MessageBody = serde_json::from_value(message.body.clone()).unwrap_or_default();
        let st = self.synced().await?;
        let agents = st.board.capabilities(&self.room);
        let config = st.config().effective(&self.room, message.thread.as_deref());
        let to = addressing::address_in_room(&body.text, &body.mentions, None, &agents);
        let eligible = addressing::eligible(&message.actor, message.role, &body.text, &to, false);
        let known = agents.keys().cloned().collect();
        let each = addressing::answers_each(
            &eligible,
            &body.text,
            &body.mentions,
            &known,
            config.group_reply,
        );
        Ok(each && eligible.contains(&self.agent))
    }

    /// Writes the one reply to `parent`: under the message's reply claim, which the
    /// reply closes (the same claim a relay answers under), so a message gets one reply
    /// whether relays or agents acting for themselves answer it.
    async fn reply(
        &self,
        parent: InteractionId,
        each: bool,
        row: NewInteraction,
    ) -> Result<Written> {
        let key = reply_key_for(&self.room, &parent, &self.agent, each);
        let state = match self.store.acquire(&key, &self.agent, REPLY_LEASE).await? {
            Acquired::Won(c) => c,
            Acquired::HeldBy(c) => {
                return Err(AgentError::ReplyTaken {
                    message: parent.to_string(),
                    why: format!("{} is answering it now", c.holder),
                })
            }
            Acquired::Closed { state, by } => {
                // A retry of this very reply: it is already in the ledger.
                if by == row.id() {
                    return Ok(Written {
                        id: by.to_string(),
                        inserted: false,
                    });
                }
                return Err(AgentError::ReplyTaken {
                    message: parent.to_string(),
                    why: format!("{} answered it ({by})", state.holder),
                });
            }
        };
        let fence = Fence {
            key,
            holder: self.agent.clone(),
            epoch: state.epoch,
        };
        match self.store.append_under(&[fence], true, vec![row]).await {
            Ok(out) => {
                self.store.flush().await;
                written(&out)
            }
            Err(StoreError::Fenced { .. }) => Err(AgentError::LeaseLost(format!(
                "your hold on the reply to {parent} lapsed before the reply was written; nothing was recorded"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// `board`: who is doing what, as the `<coordination>` block and as data; the
    /// block also shows open decisions, waiting barriers, the coordinator lease and
    /// pending approval requests.
    pub async fn board(&self) -> Result<BoardResult> {
        let now = self.store.now().await?;
        let st = self.synced().await?;
        let summary = st.dag.summary(&self.room);
        let mut patterns = st.patterns.lines(&self.room, now, st.authority.approvals());
        patterns.benched = huddle_core::pacing::benched(
            st.board.room(&self.room),
            &st.config().effective(&self.room, None),
            now,
        );
        let block = st
            .board
            .coordination_with(&self.room, &self.agent, Some(summary), patterns);
        Ok(BoardResult {
            coordination: block.map(|b| b.text),
            board: serde_json::to_value(st.board.room(&self.room)).unwrap_or_default(),
            tasks: SummaryView::from(summary),
        })
    }
}
