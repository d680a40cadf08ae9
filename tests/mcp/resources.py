"""Resources of `huddle mcp`: lists the room's timeline, board and tasks, reads them,
subscribes (`resources/subscribe`, protocol 2025-11-25) and receives
`notifications/resources/updated` after another agent posts and claims, nothing after
unsubscribing; then the same through `subscriptions/listen` (protocol 2026-07-28).
Prints OK at the end."""

import asyncio
import json
import os
import warnings

from huddle_mcp import agent, call
from mcp import types
from mcp.client.subscriptions import listen

# resources/subscribe is the subscription of the protocol version the SDK negotiates
# by default (2025-11-25); the SDK marks it deprecated in favour of 2026's listen.
warnings.simplefilter("ignore", DeprecationWarning)

ROOM = os.environ["HUDDLE_ROOM"]
BASE = f"huddle://room/{ROOM}"


async def main():
    updates = asyncio.Queue()

    async def on_message(message):
        if isinstance(message, types.ResourceUpdatedNotification):
            await updates.put(str(message.params.uri))

    async def next_update(timeout):
        return await asyncio.wait_for(updates.get(), timeout=timeout)

    async with agent("bo", message_handler=on_message) as bo, agent("cy") as cy:
        listed = (await bo.list_resources()).resources
        uris = {str(r.uri) for r in listed}
        assert uris == {f"{BASE}/timeline", f"{BASE}/board", f"{BASE}/tasks"}, uris

        tasks = await bo.read_resource(f"{BASE}/tasks")
        doc = json.loads(tasks.contents[0].text)
        assert doc["summary"]["total"] == 3, doc
        try:
            await bo.read_resource(f"{BASE}/nothing")
            raise AssertionError("an unknown resource was read")
        except Exception as e:  # the SDK raises its MCPError
            assert "no resource" in str(e), e

        await bo.subscribe_resource(f"{BASE}/timeline")
        await bo.subscribe_resource(f"{BASE}/tasks")
        try:
            await bo.subscribe_resource(f"{BASE}/nothing")
            raise AssertionError("subscribed to an unknown resource")
        except Exception as e:
            assert "no resource" in str(e), e
        # Another agent posts: the timeline changed.
        await call(cy, "post", {"text": "news"})
        got = await next_update(10)
        assert got == f"{BASE}/timeline", got
        timeline = json.loads((await bo.read_resource(f"{BASE}/timeline")).contents[0].text)
        assert timeline[-1]["body"]["text"].startswith("news"), timeline[-1]
        # A claim changes the tasks resource (and the timeline).
        await call(cy, "task_claim", {"task": "a"})
        seen = set()
        while seen != {f"{BASE}/tasks", f"{BASE}/timeline"}:
            seen.add(await next_update(10))
        # Unsubscribed from both, posts bring no more updates.
        await bo.unsubscribe_resource(f"{BASE}/timeline")
        await bo.unsubscribe_resource(f"{BASE}/tasks")
        while not updates.empty():
            updates.get_nowait()
        await call(cy, "post", {"text": "quiet"})
        try:
            extra = await next_update(2)
            raise AssertionError(f"an update after unsubscribing: {extra}")
        except asyncio.TimeoutError:
            pass

    # The 2026-07-28 protocol: subscriptions/listen with the same resources.
    async with agent("dee", modern=True) as dee, agent("cy") as cy:
        assert dee.protocol_version == "2026-07-28", dee.protocol_version
        timeline = f"{BASE}/timeline"
        async with listen(dee, resource_subscriptions=[timeline, f"{BASE}/nothing"]) as sub:
            assert list(sub.honored.resource_subscriptions or []) == [timeline], sub.honored
            events = aiter(sub)
            await call(cy, "post", {"text": "modern news"})
            got = await asyncio.wait_for(anext(events), timeout=10)
            assert str(got.uri) == timeline, got
    print("OK")


asyncio.run(main())
