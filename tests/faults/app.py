"""The worker app the fault suite runs: ``sundial worker --app tests.faults.app:worker``.

Its pool comes from ``SUNDIAL_FAULT_POOL`` (each scenario has a topic of its own in the session's broker).
``work`` takes ``payload["ms"]`` milliseconds (a handler a fault can land in the middle of); ``storm`` fails
until the epoch second ``payload["failUntil"]`` — a downstream outage — then succeeds.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sundial_worker import Context, Worker

worker = Worker(pool=os.environ.get("SUNDIAL_FAULT_POOL", "faults"), concurrency=32)


@worker.handler("work")
async def work(ctx: Context, payload: Any) -> dict[str, int]:
    await asyncio.sleep(float(payload.get("ms", 50)) / 1000)
    return {"attempt": ctx.attempt}


@worker.handler("storm")
async def storm(ctx: Context, payload: Any) -> dict[str, int]:
    if time.time() < float(payload["failUntil"]):
        raise ConnectionError("downstream unavailable")
    return {"attempt": ctx.attempt}
