"""The gateway's group commit of start and finish statements: a call alone goes at once, and the calls that come
while the statements in flight run go together in the next one, each answered with its own rows."""

from __future__ import annotations

import asyncio

import pytest
from sundial_gateway.gather import Gather


class _Flushes:
    """A flush that records its batches and is held until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()

    async def __call__(self, requests: list[int]) -> list[int]:
        self.batches.append(list(requests))
        await self.release.wait()
        return [10 * r for r in requests]


async def test_a_lone_call_goes_at_once_and_those_that_wait_go_together() -> None:
    flushes = _Flushes()
    gather: Gather[int, int] = Gather(flushes, parallel=1)

    first = asyncio.create_task(gather.submit(1))
    for _ in range(3):
        await asyncio.sleep(0)
    assert flushes.batches == [[1]], "a call alone is flushed in the same moment, no window waited"

    later = [asyncio.create_task(gather.submit(n)) for n in (2, 3, 4)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert flushes.batches == [[1]], "calls made while a flush is in flight wait for it"

    flushes.release.set()
    assert await first == 10
    assert await asyncio.gather(*later) == [20, 30, 40], "each caller gets its own answer"
    assert flushes.batches == [[1], [2, 3, 4]], "those that waited went in one flush"


async def test_two_flushes_run_side_by_side_and_a_failed_one_reaches_its_callers() -> None:
    flushes = _Flushes()
    gather: Gather[int, int] = Gather(flushes, parallel=2)
    a = asyncio.create_task(gather.submit(1))
    for _ in range(3):
        await asyncio.sleep(0)
    b = asyncio.create_task(gather.submit(2))
    for _ in range(3):
        await asyncio.sleep(0)
    assert flushes.batches == [[1], [2]], "a second call goes beside the first"

    flushes.release.set()
    assert (await a, await b) == (10, 20)

    async def failing(requests: list[int]) -> list[int]:
        raise RuntimeError("statement failed")

    broken: Gather[int, int] = Gather(failing)
    with pytest.raises(RuntimeError, match="statement failed"):
        await broken.submit(5)
    assert await gather.submit(3) == 30, "a later batch is flushed as usual"
