"""An exec agent that also acts through huddle's MCP tools: the relay drives it (prompt
on stdin, reply on stdout) and hands it HUDDLE_MCP, the command starting `huddle mcp`
for it in the turn's room. It looks up the tasks it holds, posts a note in the room as
itself, and replies `mine=<tasks it holds>`."""

import asyncio
import os
import shlex
import sys

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from huddle_mcp import call


async def main():
    sys.stdin.read()
    words = shlex.split(os.environ["HUDDLE_MCP"])
    params = StdioServerParameters(command=words[0], args=words[1:], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tasks = await call(s, "tasks")
            mine = ",".join(sorted(tasks["yours"]))
            await call(s, "post", {"text": f"working on {mine}"})
    print(f"mine={mine}")


asyncio.run(main())
