"""Two agents on one `huddle mcp --http` server, each with its own bearer token, through
the official MCP Python SDK's streamable HTTP client; and the refusals, with plain
HTTP requests: no token, a wrong token, another agent's token on a session, a removed
token. Reads HUDDLE_URL, HUDDLE_BIN, HUDDLE_DB, HUDDLE_ROOM, and the tokens
HUDDLE_TOKEN_AVA, HUDDLE_TOKEN_BO, HUDDLE_TOKEN_CY (cy's is removed here). Room: tasks
a, b (after a), c. Also: a resource subscription's updates arrive over HTTP, with both
protocol versions. Prints OK at the end."""

import asyncio
import contextlib
import json
import os
import subprocess

import warnings

import httpx2
from mcp import ClientSession, types
from mcp.client.subscriptions import listen
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from huddle_mcp import ToolError, call

# resources/subscribe is the subscription of the protocol version the SDK negotiates
# by default (2025-11-25); the SDK marks it deprecated in favour of 2026's listen.
warnings.simplefilter("ignore", DeprecationWarning)

URL = os.environ["HUDDLE_URL"]
ROOM = os.environ["HUDDLE_ROOM"]
AVA = os.environ["HUDDLE_TOKEN_AVA"]
BO = os.environ["HUDDLE_TOKEN_BO"]
CY = os.environ["HUDDLE_TOKEN_CY"]
VERSION = "2025-06-18"


@contextlib.asynccontextmanager
async def agent(token, modern=False, message_handler=None):
    """An initialised SDK session over streamable HTTP, authenticated by `token`."""
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client:
        async with streamable_http_client(URL, http_client=client) as (read, write):
            async with ClientSession(read, write, message_handler=message_handler) as session:
                if modern:
                    await session.discover()
                    yield session, None
                else:
                    yield session, await session.initialize()


def rpc(method, params=None, id=1):
    msg = {"jsonrpc": "2.0", "method": method}
    if id is not None:
        msg["id"] = id
    if params is not None:
        msg["params"] = params
    return msg


INIT = rpc("initialize", {
    "protocolVersion": VERSION,
    "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"},
})


async def post(http, body, token=None, session=None):
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if session is not None:
        headers["Mcp-Session-Id"] = session
        headers["Mcp-Protocol-Version"] = VERSION
    return await http.post(URL, content=json.dumps(body), headers=headers)


async def raw_session(http, token):
    """A session opened by plain requests: returns its id."""
    r = await post(http, INIT, token)
    assert r.status_code == 200, (r.status_code, r.text)
    sid = r.headers["mcp-session-id"]
    r = await post(http, rpc("notifications/initialized", id=None), token, sid)
    assert r.status_code == 202, (r.status_code, r.text)
    return sid


def refused_401(r, what):
    assert r.status_code == 401, (what, r.status_code, r.text)
    assert r.headers["www-authenticate"].startswith("Bearer"), (what, r.headers)


async def main():
    async with httpx2.AsyncClient(timeout=30) as http:
        # No token, a malformed one, the right id with a wrong secret: 401.
        refused_401(await post(http, INIT), "no token")
        refused_401(await post(http, INIT, "not-a-token"), "garbage")
        forged = AVA[:-1] + ("0" if AVA[-1] != "0" else "1")
        refused_401(await post(http, INIT, forged), "forged secret")
        r = await http.post(URL, content=json.dumps(INIT), headers={
            "Authorization": f"Basic {AVA}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream"})
        refused_401(r, "another scheme")

        # Two agents, each itself: identity from the token alone. ava subscribes to
        # the room's timeline and hears of bo's post (over the session's GET stream).
        updates = asyncio.Queue()

        async def on_message(message):
            if isinstance(message, types.ResourceUpdatedNotification):
                await updates.put(str(message.params.uri))

        timeline = f"huddle://room/{ROOM}/timeline"
        async with agent(AVA, message_handler=on_message) as (ava, ava_init), agent(BO) as (bo, bo_init):
            assert 'agent "ava" in room' in ava_init.instructions, ava_init.instructions
            assert 'agent "bo" in room' in bo_init.instructions, bo_init.instructions
            await ava.subscribe_resource(timeline)
            await call(ava, "post", {"text": "ava here"})
            await call(bo, "post", {"text": "bo here"})
            got = await asyncio.wait_for(updates.get(), timeout=10)
            assert got == timeline, got
            a = (await call(ava, "task_claim", {"task": "a"}))["claimed"]
            c = (await call(bo, "task_claim", {"task": "c"}))["claimed"]
            assert a["task"]["id"] == "a" and c["task"]["id"] == "c", (a, c)
            try:
                await call(bo, "task_complete", {"task": "a", "result": "stolen"})
                raise AssertionError("bo completed ava's task")
            except ToolError as e:
                assert "[not_holder]" in str(e), e
            await call(ava, "task_complete", {"task": "a", "result": "A by ava"})
            await call(bo, "task_complete", {"task": "c", "result": "C by bo"})
            tasks = await call(bo, "tasks")
            owners = {t["id"]: t.get("owner") for t in tasks["tasks"]}
            assert owners["a"] == "ava" and owners["c"] == "bo", tasks
            b = (await call(bo, "task_claim", {"task": "b"}))["claimed"]
            assert b["dependencies"][0]["result"] == "A by ava", b
            await call(bo, "task_complete", {"task": "b", "result": "B by bo"})

        # The 2026-07-28 handshake (stateless requests): still the token's agent, and
        # subscriptions/listen streams the same updates.
        async with agent(AVA, modern=True) as (ava, _):
            assert ava.protocol_version == "2026-07-28", ava.protocol_version
            async with listen(ava, resource_subscriptions=[timeline]) as sub:
                assert list(sub.honored.resource_subscriptions or []) == [timeline], sub.honored
                events = aiter(sub)
                await call(ava, "post", {"text": "ava again"})
                got = await asyncio.wait_for(anext(events), timeout=10)
                assert str(got.uri) == timeline, got

        # Another agent's token on ava's session is refused before anything runs; ava's
        # own token on it works.
        sid = await raw_session(http, AVA)
        hijack = rpc("tools/call", {"name": "post", "arguments": {"text": "bo as ava"}}, id=2)
        r = await post(http, hijack, BO, sid)
        assert r.status_code == 403, (r.status_code, r.text)
        assert "another agent" in r.text, r.text
        r = await http.get(URL, headers={"Authorization": f"Bearer {BO}",
                                         "Mcp-Session-Id": sid,
                                         "Accept": "text/event-stream"})
        assert r.status_code == 403, ("GET stream", r.status_code, r.text)
        own = rpc("tools/call", {"name": "post", "arguments": {"text": "ava raw"}}, id=3)
        r = await post(http, own, AVA, sid)
        assert r.status_code == 200 and '"isError":false' in r.text.replace(" ", ""), r.text

        # cy works, then its token is removed: its open session and new ones are refused.
        cy_sid = await raw_session(http, CY)
        r = await post(http, rpc("tools/call", {"name": "post", "arguments": {"text": "cy here"}}, id=2), CY, cy_sid)
        assert r.status_code == 200, (r.status_code, r.text)
        out = subprocess.run(
            [os.environ["HUDDLE_BIN"], "admin", "token", "remove", "--agent", "cy"],
            capture_output=True, text=True, check=True)
        assert "removed" in out.stderr, out.stderr
        r = await post(http, rpc("tools/call", {"name": "post", "arguments": {"text": "cy late"}}, id=3), CY, cy_sid)
        refused_401(r, "removed token, open session")
        refused_401(await post(http, INIT, CY), "removed token, new session")

    print("OK")


asyncio.run(main())
