"""Registering a dispatch workload's jobs through the API (``--create api``): ``POST /v1/jobs:batch``, as a user would.

One-shot jobs of pool ``demo`` (handler ``echo`` of ``{"i": i}``) in batches of 1,000 (the endpoint's limit), a few
requests in flight at once. The result line of the workload then says ``"created": "API batch"`` (``"COPY"``: the
harness's bulk insert straight into Postgres).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import datetime

import httpx

BATCH = 1000
IN_FLIGHT = 4
#: The tenant of the bench's token (registered by `migrate --tenant bench-api --pool demo=bench-api`).
TENANT = "bench-api"


async def create_jobs(api: str, token: str, pool: str, due: Sequence[datetime]) -> float:
    """Create one ONE_SHOT job per instant of ``due``; seconds taken. Raises if any item was refused."""
    limit = asyncio.Semaphore(IN_FLIGHT)
    async with httpx.AsyncClient(base_url=api, headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:

        async def batch(start: int) -> None:
            jobs = [
                {
                    "name": f"bench-{i}",
                    "type": "ONE_SHOT",
                    "runAt": due[i].isoformat(),
                    "target": {"pool": pool, "handler": "echo"},
                    "payload": {"i": i},
                }
                for i in range(start, min(start + BATCH, len(due)))
            ]
            async with limit:
                response = await client.post("/v1/jobs:batch", json={"jobs": jobs})
            response.raise_for_status()
            refused = [r for r in response.json()["results"] if r["status"] != 201]
            if refused:
                raise RuntimeError(f"{len(refused)} jobs refused, e.g. {refused[0]}")

        started = time.perf_counter()
        await asyncio.gather(*(batch(start) for start in range(0, len(due), BATCH)))
        return time.perf_counter() - started
