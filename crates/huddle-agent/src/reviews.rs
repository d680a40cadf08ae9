//! `task_review`: a reviewer's verdict on a task submitted for its review
//! (`[review @agent]` on the task's `!delegate` line).
//!
//! Written exactly as a relay writes a review turn's verdict: `task.reviewed` under
//! the review claim `review/<room>/<task>[/<generation>]` held by the reviewer, closing
//! it, so a submission is judged once. No review-drive claim: no relay drives an agent
//! that acts for itself.

use std::time::Duration;

use huddle_core::protocol::review_key;
use huddle_core::tasks::{truncate_text, TaskReviewedBody, Verdict, MAX_RESULT_BYTES};
use huddle_core::{TaskStatus, Verb};
use huddle_store::{Acquired, Fence, StoreError};

use crate::error::{AgentError, Result};
use crate::session::AgentSession;
use crate::views::{status_name, written, ReviewArgs, ReviewWritten};

impl AgentSession {
    /// `task_review`: accepts a submission (the task is done) or rejects it with
    /// feedback (the task goes back for another attempt carrying the feedback; after
    /// its last round it fails for good). Only the task's reviewer may, only while the
    /// task is submitted.
    pub async fn task_review(&self, args: ReviewArgs) -> Result<ReviewWritten> {
        let verdict = Verdict::parse_word(args.verdict.trim()).ok_or_else(|| {
            AgentError::BadArgument(format!(
                "verdict {:?}: write accept or reject",
                truncate_text(&args.verdict, 40)
            ))
        })?;
        let feedback = truncate_text(
            args.feedback.as_deref().unwrap_or("").trim(),
            MAX_RESULT_BYTES,
        );
        let mut st = self.synced().await?;
        let t = st
            .dag
            .task(&self.room, &args.task)
            .ok_or_else(|| AgentError::NoTask(args.task.clone()))?;
        let not_yours = |why: String| AgentError::NotReviewable {
            task: args.task.clone(),
            why,
        };
        match &t.review {
            Some(r) if r.agent == self.agent => {}
            Some(r) => {
                return Err(not_yours(format!(
                    "its reviewer is {}, not you; nothing was written",
                    r.agent
                )))
            }
            None => {
                return Err(not_yours(
                    "it has no review gate ([review @agent] on its !delegate line); its \
                     completion needs no verdict"
                        .into(),
                ))
            }
        }
        if t.status != TaskStatus::Submitted {
            return Err(not_yours(format!(
                "it is {}, not waiting for a review (a submission is reviewed once; \
                 `tasks` lists to_review)",
                status_name(t)
            )));
        }
        let generation = t.generation;
        let key = review_key(&self.room, &args.task, generation);
        let lease_ms = st.config().effective(&self.room, None).claim_ttl_ms.max(1);
        let won = match self
            .store
            .acquire(&key, &self.agent, Duration::from_millis(lease_ms))
            .await?
        {
            Acquired::Won(c) => c,
            Acquired::HeldBy(c) => {
                return Err(AgentError::HeldBy {
                    task: args.task.clone(),
                    holder: c.holder,
                    epoch: c.epoch,
                    expires_at: c.expires_at,
                })
            }
            Acquired::Closed { .. } => {
                return Err(AgentError::NotReviewable {
                    task: args.task.clone(),
                    why: "its submission was reviewed already (the review claim is closed)".into(),
                })
            }
        };
        // Act on the claim only with the ledger read up to the acquisition.
        self.catch_up(&mut st).await?;
        let still = st
            .dag
            .task(&self.room, &args.task)
            .is_some_and(|t| t.status == TaskStatus::Submitted && t.generation == generation);
        if !still {
            self.store.release(&key, &self.agent, won.epoch).await?;
            return Err(AgentError::NotReviewable {
                task: args.task.clone(),
                why: "its submission was reviewed meanwhile; nothing was written".into(),
            });
        }
        let body = TaskReviewedBody {
            task: args.task.clone(),
            epoch: won.epoch,
            verdict,
            feedback,
            generation,
        };
        let row = self.row(Verb::TaskReviewed, body.to_body(), None);
        let fence = Fence {
            key,
            holder: self.agent.clone(),
            epoch: won.epoch,
        };
        let out = match self.store.append_under(&[fence], true, vec![row]).await {
            Ok(out) => out,
            Err(StoreError::Fenced { .. }) => {
                return Err(AgentError::LeaseLost(format!(
                    "your review claim on task {:?} lapsed before the verdict was written; \
                     nothing was recorded: call task_review again",
                    args.task
                )))
            }
            Err(e) => return Err(e.into()),
        };
        self.store.flush().await;
        self.catch_up(&mut st).await?;
        let status = st
            .dag
            .task(&self.room, &args.task)
            .map(status_name)
            .unwrap_or_default();
        tracing::info!(room = %self.room, agent = %self.agent, task = %args.task, verdict = %verdict, "task reviewed");
        Ok(ReviewWritten {
            task: args.task,
            verdict: verdict.as_str().to_string(),
            written: written(&out)?,
            status,
        })
    }
}
