"""One agent working the room's tasks through task_claim / task_complete only.

Usage: worker.py AGENT EXEC_LOG [--crash-after-claims N]
Every execution (a claimed task the worker starts on) is appended to EXEC_LOG as
`agent task epoch`; every accepted completion as `done agent task epoch`. With
--crash-after-claims N the worker dies abruptly (no completion, no release) right after
its Nth claim, like a killed client. Ends when the room has no work left."""

import asyncio
import os
import sys

from huddle_mcp import ToolError, agent, call


async def main():
    key, log_path = sys.argv[1], sys.argv[2]
    crash_after = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--crash-after-claims" else None
    claims = 0
    async with agent(key) as s:
        with open(log_path, "a", buffering=1) as log:
            while True:
                r = await call(s, "task_claim", {"wait_ms": 2000})
                if r["settled"]:
                    break
                c = r["claimed"]
                if c is None:
                    continue
                task, epoch = c["task"]["id"], c["epoch"]
                log.write(f"exec {key} {task} {epoch}\n")
                claims += 1
                if crash_after is not None and claims >= crash_after:
                    os._exit(9)
                deps = ",".join(d["id"] for d in c["dependencies"])
                try:
                    await call(s, "task_complete", {
                        "task": task, "result": f"{task} by {key} after [{deps}]",
                        "idempotency_key": f"{task}-{epoch}",
                    })
                    log.write(f"done {key} {task} {epoch}\n")
                except ToolError as e:
                    assert "[stale_claim]" in str(e), e
                    log.write(f"stale {key} {task} {epoch}\n")
    print("OK")


asyncio.run(main())
