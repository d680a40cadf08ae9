"""Decisions, barriers and the coordinator lease through `huddle mcp`, three agents
(ava, bo, cy) in HUDDLE_ROOM, each its own server process. Prints OK at the end."""

import asyncio

from huddle_mcp import agent, call, refused

PATTERN_TOOLS = {
    "propose", "vote", "decision", "barrier_open", "barrier_arrive", "barrier",
    "lease_acquire", "lease_renew", "lease_release", "lease_directive", "lease",
}


async def main():
    async with agent("ava") as ava, agent("bo") as bo, agent("cy") as cy:
        names = {t.name for t in (await ava.list_tools()).tools}
        assert PATTERN_TOOLS <= names, f"missing tools: {PATTERN_TOOLS - names}"

        # A decision among the three: two concurring votes of three commit.
        p = await call(ava, "propose", {
            "id": "ship", "question": "Ship 1.0?", "voters": ["ava", "bo", "cy"],
            "window_ms": 60000,
        })
        assert p["decision"]["status"] == "open" and p["decision"]["quorum_count"] == 2, p
        await refused(bo, "propose", {"id": "ship", "voters": ["bo"], "window_ms": 1000},
                      "name_taken")
        await refused(bo, "vote", {"id": "ship", "option": "maybe"}, "bad_argument")
        waiting = asyncio.create_task(call(cy, "decision", {"id": "ship", "wait_ms": 20000}))
        await call(ava, "vote", {"id": "ship", "option": "yes"})
        v = await call(bo, "vote", {"id": "ship", "option": "yes"})
        assert v["decision"]["status"] == "committed", v
        await refused(bo, "vote", {"id": "ship", "option": "no"}, "already_voted")
        d = await waiting
        assert d["status"] == "committed" and d["option"] == "yes", d
        closed = await call(ava, "decision", {"id": "ship"})
        assert closed["closed_by"] == "decision.committed", closed

        # A barrier: the roster (bo, cy) checks in; ava waits for it to pass.
        b = await call(ava, "barrier_open", {"phase": "build", "roster": ["bo", "cy"],
                                             "timeout_ms": 60000, "quorum": 1})
        assert b["barrier"]["missing"] == ["bo", "cy"], b
        await refused(ava, "barrier_arrive", {"phase": "build"}, "not_listed")
        waiting = asyncio.create_task(call(ava, "barrier", {"phase": "build", "wait_ms": 20000}))
        await call(bo, "barrier_arrive", {"phase": "build"})
        await call(cy, "barrier_arrive", {"phase": "build"})
        passed = await waiting
        assert passed["status"] == "passed" and passed["dropped"] == [], passed

        # The coordinator lease.
        held = await call(bo, "lease_acquire", {"ttl_ms": 30000})
        lease = held["lease"]
        assert lease["status"] == "held" and lease["holder"] == "bo" and lease["you_hold"], held
        await refused(cy, "lease_acquire", {}, "lease_held")
        await refused(cy, "lease_directive", {"directive": {"go": 1}}, "not_lease_holder")
        await call(bo, "lease_renew", {})
        await call(bo, "lease_directive", {"directive": {"assign": "t1", "to": "cy"}})
        seen = await call(cy, "lease", {})
        assert [d["check"] for d in seen["directives"]] == ["applies"], seen
        assert seen["directives"][0]["directive"] == {"assign": "t1", "to": "cy"}, seen
        await call(bo, "lease_release", {})
        taken = await call(cy, "lease_acquire", {"ttl_ms": 30000})
        assert taken["lease"]["holder"] == "cy", taken
        assert taken["lease"]["epoch"] > lease["epoch"], (taken, lease)
        err = await refused(bo, "lease_directive", {"directive": {"assign": "t2", "to": "bo"}},
                            "stale_claim")
        assert "cy took it" in err, err
    print("OK")


asyncio.run(main())
