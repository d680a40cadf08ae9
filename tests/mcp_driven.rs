//! A driven agent that also acts: a relay runs an exec agent (a client written with
//! the official MCP Python SDK) and hands it `HUDDLE_MCP`; through it the agent sees
//! the task its relay claimed for it as its own and posts in the room as itself, and
//! as nobody else. On both backends.

use crate::common;

use common::mcp::driven_agent_script;
use common::relays::{secs, AgentSpec, Backend, Huddle};
use huddle_core::{Role, Verb};

on_both_backends!(an_exec_agent_acts_through_the_mcp_server_its_relay_hands_it);

async fn an_exec_agent_acts_through_the_mcp_server_its_relay_hands_it(backend: Backend) {
    let mut h = Huddle::new(backend).await;
    let script = driven_agent_script(&h);
    h.spawn_relay("r0", vec![AgentSpec::exec("ada", &script)]);
    h.wait_registered(&["ada"]).await;
    h.delegate("t1: first\nt2: second [after t1]").await;
    h.wait_until("2 tasks done", secs(120), |l| l.summary().done == 2)
        .await;
    h.wait_quiescent(secs(30)).await;
    h.stop_all().await;
    let done = h.ledger.assert_all_done_exactly_once(2);
    // Each turn's agent saw, through its own MCP server, exactly the task its relay
    // was driving it on.
    for task in ["t1", "t2"] {
        let result = h.ledger.task(task).and_then(|t| t.result.clone());
        assert_eq!(
            result.as_deref().map(str::trim_end),
            Some(format!("mine={task}").as_str()),
            "{done:?}"
        );
    }
    // And it posted in the room as itself: role agent, actor ada.
    let notes: Vec<(String, Role, String)> = h
        .ledger
        .of_verb(Verb::MessagePosted)
        .filter_map(|(_, r)| {
            let text = r.body.get("text")?.as_str()?;
            text.starts_with("working on ")
                .then(|| (r.actor.clone(), r.role, text.to_string()))
        })
        .collect();
    assert_eq!(
        notes,
        [
            ("ada".to_string(), Role::Agent, "working on t1".to_string()),
            ("ada".to_string(), Role::Agent, "working on t2".to_string()),
        ]
    );
}
