"""The conformance handler contract, in the Python SDK: what every gateway worker implements.

- ``echo``: returns its payload;
- ``sleep``: sleeps ``payload["seconds"]`` a second at a time, reporting ``{"slept": n}`` as progress after each,
  and stops when cancelled;
- ``fail``: fails with ``ConformanceError`` (``payload["message"]``);
- ``crash``: the worker process dies mid-attempt.

``sundial worker --app tests.conformance.handlers:worker`` with ``SUNDIAL_WORKER_GATEWAY`` and a pool token.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sundial_worker import Context, Worker

worker = Worker(pool=os.environ.get("CONFORMANCE_POOL", "conformance"), concurrency=4)


class ConformanceError(Exception):
    pass


@worker.handler("echo")
async def echo(ctx: Context, payload: Any) -> Any:
    return payload


@worker.handler("sleep")
async def sleep(ctx: Context, payload: Any) -> dict[str, int]:
    slept = 0
    for _ in range(int(payload.get("seconds", 1))):
        await asyncio.sleep(1)
        slept += 1
        await ctx.heartbeat(progress={"slept": slept})
    return {"slept": slept}


@worker.handler("fail")
async def fail(ctx: Context, payload: Any) -> None:
    raise ConformanceError(payload.get("message", "asked to fail"))


@worker.handler("crash")
async def crash(ctx: Context, payload: Any) -> None:
    os._exit(137)
