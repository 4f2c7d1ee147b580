"""The gateway's gathered start and finish compare-and-swaps, on real Postgres: the starts of concurrent pulls are one
statement, each pull gets exactly its own executions under its own worker id, and an attempt two pulls claim starts
once; the finishes of concurrent calls are one statement, each call gets only its own accepted finishes, and a
finish under another worker's identity is rejected."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sundial_common.domain.ids import parse_id
from sundial_common.stores import Stores
from sundial_common.stores.executions import Finished, Outcome
from sundial_common.stores.types import Record
from sundial_gateway.gather import FinishGather, StartGather

from tests.support.worker import dispatch


class _Counting:
    """The executions store, counting its gathered start and finish calls."""

    def __init__(self, executions: Any) -> None:
        self._executions = executions
        self.calls = 0
        self.finishes = 0

    async def finish_attempts_as(self, outcomes: Sequence[tuple[str, Outcome]]) -> list[Finished]:
        self.finishes += 1
        return await self._executions.finish_attempts_as(outcomes)  # type: ignore[no-any-return]

    async def start_executions_as(
        self, claims: Sequence[tuple[uuid.UUID, int, str]], published_at: Sequence[datetime | None] = ()
    ) -> list[Record]:
        self.calls += 1
        return await self._executions.start_executions_as(claims, published_at)  # type: ignore[no-any-return]


async def test_concurrent_starts_are_one_statement_and_each_caller_gets_its_own(stores: Stores) -> None:
    pool = f"gwg-{uuid.uuid4().hex[:8]}"
    messages = await dispatch(stores, pool, "echo", [{"n": n} for n in range(10)])
    claims = [(parse_id(m.execution_id), m.attempt) for m in messages]
    counting = _Counting(stores.executions)
    starts = StartGather(counting, window_sec=0.05)  # type: ignore[arg-type]
    mine = {f"w{n}": claims[2 * n : 2 * n + 2] for n in range(5)}
    late = [claims[0], claims[3]]  # a duplicate delivery of two attempts others claim in the same batch

    answers = await asyncio.gather(
        *(starts.start(worker, own, [None] * len(own)) for worker, own in mine.items()),
        starts.start("w-late", late, [None, None]),
    )

    assert counting.calls == 1, "five pulls and a duplicate: one start statement"
    for (worker, own), rows in zip(mine.items(), answers, strict=False):
        assert sorted((r["id"], r["attempt"]) for r in rows) == sorted(own), worker
        assert {r["worker_id"] for r in rows} == {worker}
    assert answers[-1] == [], "an attempt claimed twice is started once, for the first claim"
    stored = await stores.database.pool.fetch(
        "SELECT e.id, e.state, e.worker_id, a.worker_id AS attempt_worker FROM executions e "
        "JOIN execution_attempts a ON a.execution_id = e.id AND a.attempt = e.attempt WHERE e.id = ANY($1::uuid[])",
        [c[0] for c in claims],
    )
    owner = {c[0]: worker for worker, own in mine.items() for c in own}
    assert len(stored) == 10
    assert all(r["state"] == "RUNNING" and r["worker_id"] == r["attempt_worker"] == owner[r["id"]] for r in stored)
    audit = await stores.database.pool.fetch(
        "SELECT entity_id, actor FROM audit_log WHERE action = 'start' AND entity_id = ANY($1::uuid[])",
        [c[0] for c in claims],
    )
    assert sorted((r["entity_id"], r["actor"]) for r in audit) == sorted(owner.items())

    # Started already: the same claims again start nothing, for anyone.
    again = await asyncio.gather(*(starts.start(w, own, [None] * len(own)) for w, own in mine.items()))
    assert again == [[]] * 5 and counting.calls == 2

    # Finishes: five callers' at once, one naming another's attempt, one repeating its own: one statement.
    finishes = FinishGather(counting, window_sec=0.05)  # type: ignore[arg-type]
    ended = await asyncio.gather(
        *(finishes.finish(w, [Outcome(i, a, "SUCCEEDED") for i, a in own]) for w, own in mine.items()),
        finishes.finish("w-late", [Outcome(claims[4][0], claims[4][1], "FAILED", error="E: not mine")]),
        finishes.finish("w0", [Outcome(claims[0][0], claims[0][1], "SUCCEEDED")]),
    )
    assert counting.finishes == 1
    for (worker, own), finished in zip(mine.items(), ended, strict=False):
        assert sorted((f.execution_id, f.attempt) for f in finished) == sorted(own), worker
        assert {f.state for f in finished} == {"SUCCEEDED"}
    assert ended[-2:] == [[], []], "another worker's attempt is rejected; a repeat is not accepted twice"
    states = await stores.database.pool.fetch(
        "SELECT state FROM execution_attempts WHERE execution_id = ANY($1::uuid[])", [c[0] for c in claims]
    )
    assert [r["state"] for r in states] == ["SUCCEEDED"] * 10
    finish_actors = await stores.database.pool.fetch(
        "SELECT entity_id, actor FROM audit_log WHERE action = 'finish' AND entity_id = ANY($1::uuid[])",
        [c[0] for c in claims],
    )
    assert sorted((r["entity_id"], r["actor"]) for r in finish_actors) == sorted(owner.items())
