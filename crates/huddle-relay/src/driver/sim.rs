//! The built-in simulated agent: configurable turn time, failure rate and token cost,
//! deterministic from a seed. Used by the demo, tests and benchmarks.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{Driver, SplitMix64, TurnOutcome, TurnRequest};

/// Settings of a simulated agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSettings {
    /// Mean turn duration in milliseconds.
    pub turn_ms: u64,
    /// Relative jitter of the duration, 0.0..=1.0.
    pub jitter: f64,
    /// Probability that a turn fails, 0.0..=1.0.
    pub failure_rate: f64,
    /// Tokens a turn costs.
    pub tokens: u64,
    /// Seed; with the agent key and the turn's subject it fixes every outcome.
    pub seed: u64,
}

impl Default for SimSettings {
    fn default() -> Self {
        SimSettings {
            turn_ms: 200,
            jitter: 0.0,
            failure_rate: 0.0,
            tokens: 100,
            seed: 1,
        }
    }
}

impl SimSettings {
    /// Checks ranges; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.failure_rate) {
            return Err(format!(
                "failure_rate must be within 0.0..=1.0, got {}",
                self.failure_rate
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(format!(
                "jitter must be within 0.0..=1.0, got {}",
                self.jitter
            ));
        }
        if self.turn_ms > 3_600_000 {
            return Err(format!(
                "turn_ms must be at most 3600000, got {}",
                self.turn_ms
            ));
        }
        Ok(())
    }
}

/// A simulated agent.
#[derive(Clone, Debug)]
pub struct SimDriver {
    settings: SimSettings,
}

impl SimDriver {
    /// A simulator with `settings`.
    pub fn new(settings: SimSettings) -> Self {
        SimDriver { settings }
    }

    /// What the turn will do, decided before it runs: (duration, fails, tokens).
    pub fn plan(&self, request: &TurnRequest) -> (Duration, bool, u64) {
        let s = &self.settings;
        let mut rng = SplitMix64::new(s.seed, &format!("{}|{}", request.agent, request.subject()));
        let factor = 1.0 + s.jitter * (2.0 * rng.next_f64() - 1.0);
        let ms = (s.turn_ms as f64 * factor).max(0.0);
        let fails = rng.next_f64() < s.failure_rate;
        (Duration::from_micros((ms * 1000.0) as u64), fails, s.tokens)
    }
}

#[async_trait]
impl Driver for SimDriver {
    async fn run(&self, request: TurnRequest, cancel: CancellationToken) -> TurnOutcome {
        // The simulated work starts here, in the relay's own process.
        if request.too_late() {
            return TurnOutcome::NotStarted;
        }
        let (duration, fails, tokens) = self.plan(&request);
        tokio::select! {
            _ = cancel.cancelled() => TurnOutcome::Cancelled,
            _ = tokio::time::sleep(duration) => {
                if fails {
                    TurnOutcome::failed("simulated failure", tokens)
                } else {
                    let what = request.task.as_deref().unwrap_or("the message");
                    if request.review {
                        // A simulated reviewer accepts what it is shown.
                        return TurnOutcome::replied(
                            format!("ACCEPT: {} reviewed {what}", request.agent),
                            tokens,
                        );
                    }
                    TurnOutcome::replied(format!("{} finished {what}", request.agent), tokens)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(task: &str, attempt: u32) -> TurnRequest {
        TurnRequest {
            room: "r".into(),
            thread: None,
            agent: "ada".into(),
            task: Some(task.into()),
            epoch: Some(huddle_core::ClaimEpoch(1)),
            attempt,
            prompt: "do it".into(),
            effect_key: String::new(),
            trace: String::new(),
            review: false,
            progress: Default::default(),
            start_by: None,
        }
    }

    #[test]
    fn plans_are_deterministic_and_failure_rate_is_respected() {
        let d = SimDriver::new(SimSettings {
            failure_rate: 0.3,
            jitter: 0.5,
            ..Default::default()
        });
        assert_eq!(d.plan(&req("t1", 1)), d.plan(&req("t1", 1)));
        let fails = (0..2000)
            .filter(|i| d.plan(&req(&format!("t{i}"), 1)).1)
            .count();
        assert!((450..750).contains(&fails), "{fails} of 2000 failed");
        let never = SimDriver::new(SimSettings::default());
        assert!((0..100).all(|i| !never.plan(&req(&format!("t{i}"), 1)).1));
    }

    #[tokio::test]
    async fn cancellation_stops_a_turn() {
        let d = SimDriver::new(SimSettings {
            turn_ms: 60_000,
            ..Default::default()
        });
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let h = tokio::spawn(async move { d.run(req("t", 1), c2).await });
        cancel.cancel();
        let out = tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .expect("cancel is prompt")
            .expect("join");
        assert_eq!(out, TurnOutcome::Cancelled);
    }

    #[test]
    fn settings_are_checked() {
        assert!(SimSettings {
            failure_rate: 1.5,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SimSettings::default().validate().is_ok());
    }
}
