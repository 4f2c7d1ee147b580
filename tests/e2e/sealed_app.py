"""The worker app of the encryption proof: ``sundial worker --app tests.e2e.sealed_app:worker``.

``secrets`` checkpoints its payload as progress, then returns it, or (``payload["fail"]``) fails with an error
that quotes it: every place a payload can be copied to at rest gets the test's marker.
"""

from __future__ import annotations

import os
from typing import Any

from sundial_worker import Context, Worker

worker = Worker(pool=os.environ.get("SUNDIAL_SEALED_POOL", "sealed"), concurrency=8)


@worker.handler("secrets")
async def secrets(ctx: Context, payload: Any) -> dict[str, Any]:
    await ctx.heartbeat(progress={"seen": payload["secret"]})
    if payload.get("fail"):
        raise ValueError(f"the downstream refused {payload['secret']}")
    return {"echo": payload, "attempt": ctx.attempt}
