"""sundial_worker: the SDK a tenant service imports to run handlers for a pool, and its runtime.

```python
from sundial_worker import Worker

worker = Worker(pool="email-sender", concurrency=16)

@worker.handler("send_welcome")
async def send_welcome(ctx, payload: dict) -> dict | None:
    await ctx.heartbeat(progress={"sent": 10})
```

Run it with ``sundial worker --app mymodule:worker``.
"""

from sundial_worker.errors import WorkerCrashed
from sundial_worker.inflight import WorkerStats
from sundial_worker.runtime import WorkerConfig, WorkerRuntime
from sundial_worker.sdk import Context, HandlerSpec, ReplayInfo, Worker

__all__ = [
    "Context",
    "HandlerSpec",
    "ReplayInfo",
    "Worker",
    "WorkerConfig",
    "WorkerCrashed",
    "WorkerRuntime",
    "WorkerStats",
]
