"""Shared helpers of the MCP client scripts: start `huddle mcp` for one agent with the
official MCP Python SDK's stdio client, and call tools with structured results."""

import contextlib
import json
import os

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


class ToolError(Exception):
    """A tool answered with is_error: the text says what was wrong."""


@contextlib.asynccontextmanager
async def agent(agent_key, room=None, db=None, capabilities=None, message_handler=None, modern=False):
    """An initialised MCP client session speaking for `agent_key`: the 2025-11-25
    handshake (`initialize`), or with `modern` the 2026-07-28 one (`server/discover`)."""
    args = ["mcp", "--room", room or os.environ["HUDDLE_ROOM"], "--agent", agent_key]
    if capabilities:
        args += ["--capabilities", ",".join(capabilities)]
    env = dict(os.environ)
    env["HUDDLE_DB"] = db or os.environ["HUDDLE_DB"]
    params = StdioServerParameters(command=os.environ["HUDDLE_BIN"], args=args, env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=message_handler) as session:
            if modern:
                await session.discover()
            else:
                await session.initialize()
            yield session


async def call(session, name, args=None):
    """Calls a tool; returns its structured content or raises ToolError."""
    result = await session.call_tool(name, args or {})
    text = "".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        raise ToolError(text)
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(text)


async def refused(session, tool, args, code):
    """Calls a tool that must refuse with `[code]`; returns the error text."""
    try:
        await call(session, tool, args)
    except ToolError as e:
        assert f"[{code}]" in str(e), e
        return str(e)
    raise AssertionError(f"{tool} {args} was not refused")
