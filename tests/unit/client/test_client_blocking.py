"""The blocking client is the asynchronous one run on a loop of its own: it answers from any thread, from
inside a running event loop, pages lazily, and keeps the retries and waits it was given."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
from sundial_client import Client, Retries
from sundial_client.cli.common import run
from sundial_client.cli.jobs import parser as jobs_parser

JOB = "0196f1c2-0000-7000-8000-000000000001"


def page(request: httpx.Request) -> httpx.Response:
    cursor = request.url.params.get("cursor")
    at = int(cursor or 0)
    entry = {"at": "2026-11-28T00:00:00Z", "action": f"a{at}", "actor": "me", "fromState": None, "toState": None}
    items = [{**entry, "detail": None}]
    return httpx.Response(200, json={"items": items, "nextCursor": str(at + 1) if at < 4 else None})


def test_listings_page_lazily_and_stop_when_abandoned() -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params.get("cursor", ""))
        return page(request)

    with Client("http://api.test", token="t", transport=httpx.MockTransport(answer)) as client:
        trail = client.jobs.audit(JOB, page_size=1)
        assert [next(trail).action, next(trail).action] == ["a0", "a1"]
        trail.close()  # type: ignore[attr-defined]  # typed as an Iterator, it is a generator: closable
        assert asked == ["", "1"]  # two pages fetched, no more
        assert [e.action for e in client.executions.audit(JOB, page_size=1)] == ["a0", "a1", "a2", "a3", "a4"]


def test_it_answers_from_several_threads_and_inside_a_running_loop() -> None:
    with Client("http://api.test", token="t", transport=httpx.MockTransport(page)) as client:
        seen: list[int] = []

        def read() -> None:
            seen.append(len(list(client.jobs.audit(JOB))))

        threads = [threading.Thread(target=read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert seen == [5] * 8

        async def inside() -> int:
            return len(list(client.jobs.audit(JOB)))  # a blocking call from a coroutine: still answers

        assert asyncio.run(inside()) == 5


def test_retries_wait_with_the_sleep_it_was_given() -> None:
    waits: list[float] = []
    tries: list[int] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        tries.append(1)
        if len(tries) < 3:
            return httpx.Response(503, headers={"Retry-After": "1"}, json={"status": 503})
        return page(request)

    retry = Retries(attempts=5)
    with Client(
        "http://api.test", token="t", transport=httpx.MockTransport(flaky), retry=retry, sleep=waits.append
    ) as c:
        assert next(iter(c.jobs.audit(JOB))).action == "a0"
    assert waits == [1.0, 1.0] and len(tries) == 3


def test_backfill_wait_follows_until_its_executions_ended(capsys: Any) -> None:
    states = iter([("RUNNING", 1, 0), ("RUNNING", 2, 1), ("DONE", 2, 2)])

    def backfill(request: httpx.Request) -> httpx.Response:
        state, created, finished = next(states)
        body = {
            "backfillId": "b1",
            "jobId": JOB,
            "from": "2026-11-28T00:00:00Z",
            "to": "2026-11-28T00:02:00Z",
            "overlapPolicy": "ALLOW",
            "ratePerSec": 10,
            "state": state,
            "total": 2,
            "created": created,
            "finished": finished,
            "cursor": None,
            "createdAt": "2026-11-28T01:00:00Z",
            "finishedAt": None,
        }
        return httpx.Response(202 if request.method == "POST" else 200, json=body)

    argv = ["backfill", JOB, "--from", "2026-11-28T00:00:00Z", "--to", "2026-11-28T00:02:00Z", "--wait"]
    with Client("http://api.test", token="t", transport=httpx.MockTransport(backfill)) as client:
        assert run(jobs_parser(), [*argv, "--interval", "0"], client) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[1].strip() for line in lines] == [
        "1/2 created, 0 finished (job " + JOB + ", 2026-11-28T00",
        "2/2 created, 1 finished (job " + JOB + ", 2026-11-28T00",
        "2/2 created, 2 finished (job " + JOB + ", 2026-11-28T00",
    ]
