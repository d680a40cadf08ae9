"""Lists the tools of `huddle mcp` and calls every one, checking the results; then a
stale completion after a lapsed lease is refused. Room: HUDDLE_ROOM with tasks a, b
(after a) and c, claim-ttl 1s. Prints OK at the end."""

import asyncio
import time

from huddle_mcp import ToolError, agent, call

EXPECTED = {
    "read", "post", "board", "tasks", "task_claim", "task_renew",
    "task_complete", "task_fail", "task_release", "task_bid",
}


async def main():
    async with agent("bo") as bo, agent("cy") as cy:
        tools = (await bo.list_tools()).tools
        names = {t.name for t in tools}
        assert EXPECTED <= names, f"missing tools: {EXPECTED - names}"
        for t in tools:
            assert t.input_schema.get("type") == "object", t
        # No tool lets an agent name who it speaks as.
        for t in tools:
            props = t.input_schema.get("properties", {})
            assert not {"actor", "agent", "as"} & set(props), (t.name, props)

        start = await call(bo, "read", {})
        assert any(i["verb"] == "room.created" for i in start["interactions"]), start
        posted = await call(bo, "post", {"text": "@cy hello", "idempotency_key": "hi-1"})
        again = await call(bo, "post", {"text": "hello again", "idempotency_key": "hi-1"})
        assert again == {"id": posted["id"], "inserted": False}, again
        news = await call(cy, "read", {"after": start["next"], "wait_ms": 2000})
        msgs = [i for i in news["interactions"] if i["verb"] == "message.posted"]
        assert [m["actor"] for m in msgs] == ["bo"], news
        reply = await call(cy, "post", {"text": "hi bo", "reply_to": posted["id"]})
        assert reply["inserted"]
        try:
            await call(bo, "post", {"text": "me too", "reply_to": posted["id"]})
            raise AssertionError("a message got two replies")
        except ToolError as e:
            assert "[reply_taken]" in str(e) and "cy answered it" in str(e), e

        board = await call(bo, "board")
        assert board["tasks"]["total"] == 3, board
        tasks = await call(bo, "tasks")
        assert tasks["ready_for_you"] == ["a", "c"], tasks

        # This room allocates by pull: a bid is refused and says how to take work.
        try:
            await call(bo, "task_bid", {"task": "a", "load": 1})
            raise AssertionError("a bid in a pull room was accepted")
        except ToolError as e:
            assert "[not_biddable]" in str(e) and "task_claim" in str(e), e

        a = (await call(bo, "task_claim", {"task": "a"}))["claimed"]
        assert a["task"]["id"] == "a" and a["attempt"] == 1 and a["lease_ms"] == 1000, a
        renewed = await call(bo, "task_renew", {"task": "a"})
        assert renewed["epoch"] == a["epoch"], renewed
        try:
            await call(cy, "task_claim", {"task": "a"})
            raise AssertionError("cy took a task bo holds")
        except ToolError as e:
            assert "[held_by_other]" in str(e) and "bo" in str(e), e
        done = await call(bo, "task_complete", {"task": "a", "result": "A!"})
        assert done["status"] == "done", done

        b = (await call(cy, "task_claim", {"task": "b"}))["claimed"]
        assert b["dependencies"] == [{"id": "a", "label": "do a", "result": "A!"}], b
        failed = await call(cy, "task_fail", {"task": "b", "reason": "flaky"})
        assert failed["status"] == "open", failed
        # The retry waits out the task's back-off (retry-backoff, 1 s by default).
        deadline = time.monotonic() + 10
        while True:
            try:
                b2 = (await call(cy, "task_claim", {"task": "b"}))["claimed"]
                break
            except ToolError as e:
                assert "backs off until" in str(e), e
                assert time.monotonic() < deadline, e
                await asyncio.sleep(0.1)
        assert b2["attempt"] == 2, b2
        released = await call(cy, "task_release", {"task": "b", "reason": "later"})
        assert released["status"] == "open", released

        # A stale completion: bo's lease on c lapses, cy re-takes c, bo's write is refused.
        c = (await call(bo, "task_claim", {"task": "c"}))["claimed"]
        deadline = time.monotonic() + 10
        while True:
            try:
                c2 = (await call(cy, "task_claim", {"task": "c"}))["claimed"]
                break
            except ToolError as e:
                assert "[held_by_other]" in str(e), e
                assert time.monotonic() < deadline, "c's lease never lapsed"
                await asyncio.sleep(0.2)
        assert c2["epoch"] > c["epoch"], (c, c2)
        try:
            await call(bo, "task_complete", {"task": "c", "result": "late"})
            raise AssertionError("a stale completion was accepted")
        except ToolError as e:
            text = str(e)
            assert "[stale_claim]" in text and "lapsed" in text and "cy" in text, text
        done = await call(cy, "task_complete", {"task": "c", "result": "C!"})
        assert done["status"] == "done", done
        tasks = await call(bo, "tasks")
        c_view = [t for t in tasks["tasks"] if t["id"] == "c"][0]
        assert c_view["owner"] == "cy" and c_view["result"] == "C!", c_view
    print("OK")


asyncio.run(main())
