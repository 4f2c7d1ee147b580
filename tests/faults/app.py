"""The worker app the fault suite runs: ``sundial worker --app tests.faults.app:worker``.

Its pool comes from ``SUNDIAL_FAULT_POOL`` (each scenario has a topic of its own in the session's broker).
``work`` takes ``payload["ms"]`` milliseconds (a handler a fault can land in the middle of); ``storm`` fails
for ``payload["outageSec"]`` seconds from its execution's scheduled time — a downstream outage that starts when
the jobs fire, however slow creating them was — then succeeds.
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
    if time.time() < ctx.scheduled_for.timestamp() + float(payload["outageSec"]):
        raise ConnectionError("downstream unavailable")
    return {"attempt": ctx.attempt}
