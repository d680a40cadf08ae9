"""Shared resources and shared state through `huddle mcp`, two agents (ava, bo) in
HUDDLE_ROOM, each its own server process. A holding taken through a server is given
back when that server ends. Prints OK at the end."""

import asyncio

from huddle_mcp import agent, call, refused

SHARED_TOOLS = {
    "resource_acquire", "resource_renew", "resource_release", "resources",
    "state_get", "state_put", "state_list",
}


async def main():
    async with agent("bo") as bo:
        async with agent("ava") as ava:
            names = {t.name for t in (await ava.list_tools()).tools}
            assert SHARED_TOOLS <= names, f"missing tools: {SHARED_TOOLS - names}"

            held = await call(ava, "resource_acquire", {
                "resources": [{"name": "file:src/**"},
                              {"name": "slot:build", "mode": "permits", "permits": 2}],
                "ttl_ms": 30000, "reason": "refactor",
            })
            assert [r["name"] for r in held["resources"]] == ["file:src/**", "slot:build"], held
            text = await refused(bo, "resource_acquire",
                                 {"resources": [{"name": "file:src/lib.rs", "mode": "shared"}]},
                                 "resources_busy")
            assert "held by ava" in text, text
            await refused(bo, "resource_acquire", {"resources": [{"name": "src/**"}]},
                          "bad_argument")
            listed = await call(bo, "resources", {"path": "src/main.rs"})
            assert [h["holder"] for h in listed["held"]] == ["ava"], listed
            board = await call(bo, "board")
            assert "file:src/** exclusive by ava until" in board["coordination"], board
            renewed = await call(ava, "resource_renew", {"resources": ["slot:build"]})
            assert renewed["resources"][0]["name"] == "slot:build", renewed

            # Shared state: a stale put is refused with the current version and value.
            put = await call(ava, "state_put", {"key": "owner", "value": "ava", "if_version": 0})
            assert put["state"]["version"] == 1, put
            stale = await refused(bo, "state_put",
                                  {"key": "owner", "value": "bo", "if_version": 0},
                                  "stale_version")
            assert "version 1" in stale and '"ava"' in stale, stale
            got = await call(bo, "state_get", {"key": "owner"})
            assert (got["version"], got["value"]) == (1, "ava"), got
            listed = await call(bo, "state_list")
            assert [k["key"] for k in listed["keys"]] == ["owner"], listed

            # bo waits for src/; ava's server ends meanwhile, giving it back.
            waiting = asyncio.create_task(call(bo, "resource_acquire", {
                "resources": [{"name": "file:src/lib.rs"}], "wait_ms": 20000}))
            await asyncio.sleep(0.3)
            assert not waiting.done(), "bo got src/ while ava held it"
        got = await waiting
        assert got["resources"][0]["holder"] == "bo", got
        mine = await call(bo, "resources")
        assert [h["name"] for h in mine["held"]] == ["file:src/lib.rs"], mine
        released = await call(bo, "resource_release", {})
        assert len(released["resources"]) == 1, released
    print("OK")


asyncio.run(main())
