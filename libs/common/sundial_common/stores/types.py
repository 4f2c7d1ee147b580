"""What the stores and the hot window trade in: rows as read by column name, and due (id, instant) pairs.

:class:`Occurrence` (a job's due fire) and :class:`RetryDue` (an execution's due retry) are the two kinds
of hot-window member; the job, dispatch and execution stores all read or return them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias
from uuid import UUID

#: A row as asyncpg returns it (read by column name).
Record: TypeAlias = Mapping[str, Any]


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
