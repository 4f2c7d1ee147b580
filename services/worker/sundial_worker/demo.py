"""The example pool ``demo`` that ``make run`` serves: ``sundial worker --app sundial_worker.demo:worker``.

``echo`` returns its payload, ``fail`` always raises, ``flaky`` fails its first ``payload["failures"]``
attempts (default 1) and then returns, ``outage`` fails every call until the instant ``payload["until"]``
(epoch seconds) and then returns (a downstream outage that ends: the retry circuit breaker's example),
``sleep`` sleeps ``payload["seconds"]`` while checkpointing its
progress every second — and a retry resumes from the last checkpoint (``ctx.previous_progress``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sundial_worker.sdk import Context, Worker

worker = Worker(pool="demo")


@worker.handler("echo")
async def echo(ctx: Context, payload: Any) -> Any:
    return payload


@worker.handler("fail")
async def fail(ctx: Context, payload: Any) -> None:
    raise RuntimeError("demo failure")


@worker.handler("flaky")
async def flaky(ctx: Context, payload: Any) -> dict[str, int]:
    failures = int(payload.get("failures", 1)) if isinstance(payload, dict) else 1
    if ctx.attempt <= failures:
        raise RuntimeError(f"flaky: attempt {ctx.attempt} of the first {failures} fails")
    return {"attempt": ctx.attempt}


@worker.handler("outage")
async def outage(ctx: Context, payload: Any) -> dict[str, int]:
    until = float(payload.get("until", 0)) if isinstance(payload, dict) else 0.0
    if time.time() < until:
        raise RuntimeError(f"outage: downstream unavailable for {until - time.time():.0f}s more")
    return {"attempt": ctx.attempt}


@worker.handler("sleep")
async def sleep(ctx: Context, payload: Any) -> dict[str, float]:
    seconds = float(payload.get("seconds", 1)) if isinstance(payload, dict) else 1.0
    previous = ctx.previous_progress
    slept = float(previous.get("slept", 0.0)) if isinstance(previous, dict) else 0.0
    while slept < seconds:
        step = min(1.0, seconds - slept)
        await asyncio.sleep(step)
        slept += step
        await ctx.heartbeat(progress={"slept": slept})
    return {"slept": slept}


#: The same handlers in the staging pool ``staging-demo``, where ``sundial replay --pool demo --into
#: staging-demo`` sends replays: ``sundial worker --app sundial_worker.demo:staging_worker``.
staging_worker = worker.for_pool("staging-demo")
