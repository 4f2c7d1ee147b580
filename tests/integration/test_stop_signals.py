"""Stop signals on a real worker process: one Ctrl-C that arrives twice still stops gracefully.

Under `uv run sundial worker` the terminal's SIGINT and the copy `uv run` forwards reach the worker
~200 ms apart. Both must read as one graceful stop: the running handler finishes and its execution is
SUCCEEDED, not abandoned RUNNING for the sweeper.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from sundial_common.broker import KafkaPublisher
from sundial_common.stores import Stores

from tests.integration.test_worker import JOIN_SEC, dispatch, execution, publish, wait_state


@pytest.fixture
def pool() -> str:
    return f"sig-{uuid.uuid4().hex[:10]}"


async def test_sigint_twice_200ms_apart_lets_the_running_handler_finish(
    stores: Stores, publisher: KafkaPublisher, settings_env: dict[str, str], pool: str, tmp_path: Path
) -> None:
    (tmp_path / "signal_app.py").write_text(
        textwrap.dedent(
            f"""
            from sundial_worker import Worker
            from sundial_worker.demo import sleep

            worker = Worker(pool={pool!r})
            worker.handler("sleep")(sleep)
            """
        )
    )
    env = {
        **os.environ,
        **settings_env,
        "SUNDIAL_WORKER_ID": "sigint-worker",
        "SUNDIAL_WORKER_SHUTDOWN_GRACE_SEC": "20",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sundial_worker",
        "--app",
        "signal_app:worker",
        cwd=tmp_path,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    lines: list[str] = []
    assigned = asyncio.Event()

    async def read_log() -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            lines.append(raw.decode(errors="replace").rstrip())
            if "partitions assigned" in lines[-1]:
                assigned.set()

    reader = asyncio.create_task(read_log())
    try:
        await asyncio.wait_for(assigned.wait(), JOIN_SEC)
        [message] = await dispatch(stores, pool, "sleep", [{"seconds": 2}])
        await publish(publisher, [message])
        await wait_state(stores, message, "RUNNING")
        process.send_signal(signal.SIGINT)  # the terminal's
        await asyncio.sleep(0.2)
        process.send_signal(signal.SIGINT)  # uv run's forwarded copy
        code = await asyncio.wait_for(process.wait(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await asyncio.wait_for(reader, 10)
    log = "\n".join(lines)
    assert code == 0, log
    row = await execution(stores, message)
    assert (row["state"], row["result"]) == ("SUCCEEDED", {"slept": 2.0}), log
    assert "abandoning" not in log and "the same stop request" in log, log
