"""What the CLI shows of why work did not run or failed: the pool's live workers and warnings, an attempt's
traceback and log tail, an execution's wait, and a job's latest execution beside its own state."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from sundial_client.cli.render import attempt_text, pool_detail_text, state_text
from sundial_client.models import Attempt, Job, PoolDetail


def test_a_pool_shows_its_live_workers_backlog_and_warnings() -> None:
    pool = PoolDetail.model_validate(
        {
            "name": "files",
            "owner": "demo",
            "sharedWith": [],
            "kind": "production",
            "partitions": 8,
            "retentionMs": 1000,
            "defaultTimeoutSec": None,
            "defaultRetryPolicy": None,
            "version": 1,
            "createdAt": "2026-11-28T08:00:00Z",
            "updatedAt": "2026-11-28T08:00:00Z",
            "workers": {"live": 0, "freeSlots": 0, "handlers": [], "items": []},
            "backlog": {"pending": 3, "oldestPendingAt": "2026-11-28T08:01:00Z"},
            "warnings": ["no live worker in pool files: 3 of your executions wait for one"],
        }
    )
    text = pool_detail_text(pool)
    assert "0 live, 0 free slots; handlers: -" in text
    assert "3 pending, oldest since" in text
    assert "warning:  no live worker in pool files" in text


def test_an_attempt_shows_its_traceback_and_what_the_handler_logged() -> None:
    attempt = Attempt.model_validate(
        {
            "attempt": 1,
            "workerId": "w1",
            "state": "FAILED",
            "startedAt": "2026-11-28T08:00:00Z",
            "finishedAt": "2026-11-28T08:00:01Z",
            "error": "RuntimeError: not today",
            "traceback": 'File "files.py", line 11, in resize\nRuntimeError: not today',
            "logTail": ["08:00:00 INFO resizing", "08:00:01 WARNING giving up"],
            "progress": {"done": 1, "of": 2},
        }
    )
    text = "\n".join(attempt_text(attempt))
    assert 'File "files.py", line 11, in resize' in text
    assert "logged:\n      08:00:00 INFO resizing\n      08:00:01 WARNING giving up" in text
    assert '{"done": 1, "of": 2}' in text


def test_a_job_shows_its_latest_execution_beside_its_state() -> None:
    job = cast(Job, SimpleNamespace(state="COMPLETED", latest_execution_state="PENDING"))  # the two fields read
    assert state_text(job) == "COMPLETED (last run PENDING)"
