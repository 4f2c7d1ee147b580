"""Stop signals on a real worker process: one Ctrl-C that arrives twice still stops gracefully.

Under `uv run sundial worker` the terminal's SIGINT and the copy `uv run` forwards reach the worker
~200 ms apart. Both must read as one graceful stop: the running handler finishes and its execution is
SUCCEEDED, not abandoned RUNNING for the sweeper.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import pytest
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.stores import Stores

from tests.support.pools import admit
from tests.support.worker import dispatch, execution, publish, wait_state, worker_process


@pytest.fixture
def pool(database_url: str) -> str:
    # A worker runs only the work of tenants its pool admits (pool_guard): registered for the tests' tenant.
    return admit(database_url, f"sig-{uuid.uuid4().hex[:10]}", "acme")


async def test_sigint_twice_200ms_apart_lets_the_running_handler_finish(
    stores: Stores, publisher: KafkaPublisher, settings_env: dict[str, str], pool: str, tmp_path: Path
) -> None:
    async with worker_process(tmp_path, pool, settings_env, "sigint-worker") as worker:
        [message] = await dispatch(stores, pool, "sleep", [{"seconds": 2}])
        await publish(publisher, [message])
        await wait_state(stores, message, "RUNNING")
        worker.process.send_signal(signal.SIGINT)  # the terminal's
        await asyncio.sleep(0.2)
        worker.process.send_signal(signal.SIGINT)  # uv run's forwarded copy
        code = await asyncio.wait_for(worker.process.wait(), 30)
    log = worker.log
    assert code == 0, log
    row = await execution(stores, message)
    assert (row["state"], row["result"]) == ("SUCCEEDED", {"slept": 2.0}), log
    assert "abandoning" not in log and "the same stop request" in log, log
