"""The answer of a batch create (``POST /v1/jobs:batch``): one result per job, created or refused."""

from __future__ import annotations

from sundial_client.models.common import Problem, ViewModel
from sundial_client.models.jobs import Job


class BatchItem(ViewModel):
    """One item of a batch create: 201 with its `job`, or a 4xx with its `problem`."""

    index: int
    status: int
    job: Job | None = None
    problem: Problem | None = None


class BatchResult(ViewModel):
    created: int
    failed: int
    results: list[BatchItem]
