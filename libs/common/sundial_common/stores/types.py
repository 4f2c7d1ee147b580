"""What the stores and the hot window trade in: rows as read by column name, and due (id, instant) pairs.

:class:`Occurrence` (a job's due fire) and :class:`RetryDue` (an execution's due retry) are the two kinds
of hot-window member; the job, dispatch and execution stores all read or return them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias, TypeVar
from uuid import UUID

#: A row as asyncpg returns it (read by column name).
Record: TypeAlias = Mapping[str, Any]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One due fire of a job, as claimed from the hot window."""

    job_id: UUID
    due: datetime


@dataclass(frozen=True, slots=True)
class RetryDue:
    """A scheduled retry of an execution, as the hot window holds it (member ``r:<execution id>``)."""

    execution_id: UUID
    due: datetime


def by_shard(shards: Iterable[int], rows: Iterable[Record], member: Callable[[Record], T]) -> dict[int, list[T]]:
    """The rows of a statement that reads every shard of ``shards`` at once (a ``shard`` column), as ``member``
    makes them, per shard in the rows' order; a shard with no row has an empty list."""
    found: dict[int, list[T]] = {shard: [] for shard in shards}
    for row in rows:
        found[row["shard"]].append(member(row))
    return found
