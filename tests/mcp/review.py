"""Review gates over MCP (plan 0053): bo works task `w` ([review @lead rounds 2]), lead
judges it with `task_review`: a rejection sends the work back to bo with the feedback
and a new effect key, an acceptance makes it done and lets `next` start. Room:
HUDDLE_ROOM. Prints OK at the end."""

import asyncio

from huddle_mcp import agent, call, refused


async def main():
    async with agent("bo") as bo, agent("lead") as lead:
        names = {t.name for t in (await lead.list_tools()).tools}
        assert "task_review" in names, names
        first = (await call(bo, "task_claim", {"task": "w"}))["claimed"]
        assert first.get("review_feedback") is None, first
        done = await call(bo, "task_complete", {"task": "w", "result": "v1"})
        assert done["status"] == "submitted", done
        assert (await call(lead, "tasks"))["to_review"] == ["w"]
        view = [t for t in (await call(lead, "tasks"))["tasks"] if t["id"] == "w"][0]
        assert view["reviewer"] == "lead" and view["review_rounds"] == [0, 2], view
        await refused(bo, "task_review", {"task": "w", "verdict": "accept"}, "not_reviewable")
        await refused(bo, "task_claim", {"task": "w"}, "not_claimable")
        sent_back = await call(
            lead, "task_review", {"task": "w", "verdict": "reject", "feedback": "needs tests"}
        )
        assert sent_back["status"] == "open" and sent_back["verdict"] == "reject", sent_back
        await refused(lead, "task_review", {"task": "w", "verdict": "accept"}, "not_reviewable")
        redo = (await call(bo, "task_claim", {"task": "w"}))["claimed"]
        assert redo["attempt"] == 2, redo
        fb = redo["review_feedback"]
        assert fb == {
            "reviewer": "lead", "round": 1, "feedback": "needs tests", "rejected_result": "v1"
        }, fb
        assert redo["effect_key"] != first["effect_key"], (redo, first)
        await call(bo, "task_complete", {"task": "w", "result": "v2 with tests"})
        accepted = await call(lead, "task_review", {"task": "w", "verdict": "accept"})
        assert accepted["status"] == "done", accepted
        tasks = await call(bo, "tasks")
        assert tasks["ready_for_you"] == ["next"], tasks
        w = [t for t in tasks["tasks"] if t["id"] == "w"][0]
        assert w["result"] == "v2 with tests" and w["review_rounds"] == [1, 2], w
    print("OK")


asyncio.run(main())
