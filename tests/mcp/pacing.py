"""Pacing of an agent acting for itself (plan 0054). Room HUDDLE_ROOM has `late` ([due
1s]), `quiet`, `f1`; the room sets stall-timeout 2s and breaker 2. bo claims `late`
and does not finish in time: the server fails it as overdue. bo claims `quiet` and goes
silent: the server fails it as stalled. Two failures in a row bench bo: its next claim
is refused, while cy claims at once. Prints OK at the end."""

import asyncio
import time

from huddle_mcp import agent, call, refused


async def until(what, check, limit=15):
    deadline = time.monotonic() + limit
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


def task_of(tasks, tid):
    return [t for t in tasks["tasks"] if t["id"] == tid][0]


async def main():
    async with agent("bo") as bo, agent("cy") as cy:
        late = (await call(bo, "task_claim", {"task": "late"}))["claimed"]
        assert late["attempt"] == 1, late

        async def late_failed():
            t = task_of(await call(bo, "tasks"), "late")
            return t if t["status"] == "open" else None

        t = await until("late failed as overdue", late_failed)
        assert t["last_reason"].startswith("overdue:"), t
        text = await refused(bo, "task_complete", {"task": "late", "result": "too late"}, "not_holder")
        assert "overdue" in text, text
        board = await call(bo, "board")
        assert "task late: attempt 1 by bo was cancelled and failed: overdue" in str(board), board

        await call(bo, "task_claim", {"task": "quiet"})

        async def quiet_failed():
            t = task_of(await call(cy, "tasks"), "quiet")
            return t if t["status"] == "open" else None

        t = await until("quiet failed as stalled", quiet_failed)
        assert t["last_reason"].startswith("stalled:"), t

        text = await refused(bo, "task_claim", {"task": "f1"}, "not_claimable")
        assert "circuit breaker benched you" in text, text
        best = await call(bo, "task_claim", {})
        assert best["claimed"] is None and "benched" in best["reason"], best
        f1 = (await call(cy, "task_claim", {"task": "f1"}))["claimed"]
        done = await call(cy, "task_complete", {"task": "f1", "result": "ok"})
        assert f1["attempt"] == 1 and done["status"] == "done", (f1, done)
    print("OK")


asyncio.run(main())
