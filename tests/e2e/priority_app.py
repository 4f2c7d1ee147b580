"""The worker app of the priority proof: ``sundial worker --app tests.e2e.priority_app:worker``.

A pool of its own (``priority``), so the proof's two workers and their consumer group are this test's alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sundial_worker import Context, Worker

worker = Worker(pool="priority", concurrency=4)


@worker.handler("echo")
async def echo(ctx: Context, payload: Any) -> Any:
    return payload


@worker.handler("sleep")
async def sleep(ctx: Context, payload: Any) -> dict[str, float]:
    seconds = float(payload.get("seconds", 1)) if isinstance(payload, dict) else 1.0
    await asyncio.sleep(seconds)
    return {"slept": seconds}


#: The first-burst proof's pool (``--app tests.e2e.priority_app:first_burst``): a consumer group of its own, so its
#: worker never waits for the other proof's workers to leave theirs.
first_burst = worker.for_pool("priority-first")

#: The restart proof's pool (``--app tests.e2e.priority_app:after_restart``), for the same reason.
after_restart = worker.for_pool("priority-restart")
