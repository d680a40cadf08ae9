//! Every coordination-pattern fold and decision function (with the resource and
//! shared-state folds), fed arbitrary and near-valid bodies under every pattern verb:
//! nothing may panic.

use crate::barrier::{BarrierFold, BarrierRules};
use crate::budget::BudgetFold;
use crate::context::{render_related_context, select_related, ContextRules};
use crate::decision::{DecisionFold, DecisionRules};
use crate::fold::Fold;
use crate::lease::{LeaseFold, LeaseRules, DEFAULT_LEASE};
use crate::model::{Interaction, Role, Timestamp};
use crate::resources::ResourceFold;
use crate::shared_state::SharedStateFold;
use crate::testing::*;
use crate::verbs::Verb;
use proptest::prelude::*;
use serde_json::{json, Value};

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e12f64..1e12).prop_map(|f| json!(f)),
        Just(json!(f64::MAX)),
        prop::sample::select(vec!["a", "b", "", "x/y", "yes", "no", "p", "escalate"])
            .prop_map(|s| json!(s)),
        ".{0,8}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "a",
                    "b",
                    "count",
                    "weight",
                    "quorum",
                    "proceed-with-quorum",
                    "input",
                    "output"
                ])
                .prop_map(str::to_string),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bodies built from the pattern's own field names with arbitrary values.
fn body() -> impl Strategy<Value = Value> {
    let key = prop::sample::select(vec![
        "id",
        "phase",
        "voters",
        "roster",
        "epoch",
        "tokens",
        "option",
        "options",
        "quorum",
        "deadline",
        "window_ms",
        "timeout_ms",
        "on_timeout",
        "text",
        "holder",
        "ttl_ms",
        "beat",
        "min_margin",
        "name",
        "directive",
        "question",
        "resources",
        "mode",
        "expires_at",
        "key",
        "version",
        "value",
    ]);
    prop_oneof![
        value(),
        prop::collection::btree_map(key.prop_map(str::to_string), value(), 0..8)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
    ]
}

fn rows() -> impl Strategy<Value = Vec<Interaction>> {
    let verb = prop::sample::select(vec![
        Verb::DecisionProposed,
        Verb::DecisionVoted,
        Verb::DecisionCommitted,
        Verb::DecisionEscalated,
        Verb::DecisionFailed,
        Verb::BarrierOpened,
        Verb::BarrierCheckin,
        Verb::BarrierPassed,
        Verb::BarrierEscalated,
        Verb::LeaseHeartbeat,
        Verb::LeaseDirective,
        Verb::TurnReplied,
        Verb::TurnFailed,
        Verb::MessagePosted,
        Verb::ResourceAcquired,
        Verb::ResourceRenewed,
        Verb::ResourceReleased,
        Verb::StatePut,
    ]);
    let role = prop::sample::select(vec![Role::Agent, Role::System, Role::Owner]);
    let who = prop::sample::select(vec!["a", "b", "p"]);
    let at = prop_oneof![any::<i64>(), 0i64..1_000_000_000];
    prop::collection::vec((verb, who, role, at, body()), 0..24).prop_map(|v| {
        positioned(
            v.into_iter()
                .map(|(verb, who, role, at, body)| row("r", verb, who, role, Timestamp(at), body))
                .collect(),
        )
    })
}

proptest! {
    #[test]
    fn nothing_panics_on_any_body(rows in rows(), now in any::<i64>()) {
        let nows: [Timestamp; 4] = [Timestamp(now), Timestamp(0), Timestamp(i64::MIN), Timestamp(i64::MAX)];
        let mut d = DecisionFold::new();
        let mut b = BarrierFold::new();
        let mut l = LeaseFold::new();
        let mut t = BudgetFold::new();
        let mut res = ResourceFold::new();
        let mut st = SharedStateFold::new();
        for r in &rows {
            let _ = l.check_directive(r);
            d.apply(r);
            b.apply(r);
            l.apply(r);
            t.apply(r);
            res.apply(r);
            st.apply(r);
        }
        let _ = st.list("r");
        for now in nows {
            let _ = d.due(now, &DecisionRules::default(), "relay");
            let _ = d.due(now, &DecisionRules { min_margin_ppm: u64::MAX, grace_us: i64::MAX }, "relay");
            let _ = b.due(now, &BarrierRules::default(), "relay");
            let _ = b.due(now, &BarrierRules { grace_us: i64::MIN }, "relay");
            for me in ["a", "b", "p"] {
                let _ = l.due("r", DEFAULT_LEASE, me, now, &LeaseRules::default());
                let _ = l.due("r", DEFAULT_LEASE, me, now,
                    &LeaseRules { active_window_us: i64::MAX, ttl_ms: u64::MAX });
            }
            let _ = t.status("r", Some(now.as_micros().unsigned_abs()));
            let _ = crate::board::resource_lines(&res, "r", Some(now));
        }
        let rules = ContextRules { half_life_us: now, ..ContextRules::default() };
        for target in &rows {
            let ctx = select_related(target, &rows, &rules);
            let _ = render_related_context(&ctx, &rules);
        }
    }
}
