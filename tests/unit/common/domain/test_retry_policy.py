"""Backoff of the retry policy: the delays a user configures are the delays they get, jittered within bounds."""

from __future__ import annotations

import random
import uuid

import pytest
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.hotwindow.execution_signals import cancel_key, heartbeat_key
from sundial_dispatcher.dispatcher import CANCEL_KEY


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        ("FIXED", [1000, 1000, 1000, 1000, 1000]),
        ("LINEAR", [1000, 2000, 3000, 4000, 5000]),
        ("EXPONENTIAL", [1000, 2000, 4000, 8000, 10000]),  # capped at maxDelayMs
    ],
)
def test_base_delays_follow_the_backoff_and_stop_at_the_cap(backoff: str, expected: list[int]) -> None:
    policy = RetryPolicy(backoff=backoff, initial_delay_ms=1000, max_delay_ms=10_000, jitter=False)
    assert [policy.delay_ms(n) for n in range(1, 6)] == expected


def test_exponential_backoff_of_a_hundredth_attempt_is_the_cap_not_an_overflow() -> None:
    policy = RetryPolicy(initial_delay_ms=30_000, max_delay_ms=3_600_000, jitter=False)
    assert policy.delay_ms(100) == 3_600_000


def test_jitter_keeps_at_least_half_the_delay_and_spreads_the_rest() -> None:
    policy = RetryPolicy(backoff="FIXED", initial_delay_ms=1000, max_delay_ms=1000, jitter=True)
    rng = random.Random(7)
    delays = [policy.delay_ms(1, rng) for _ in range(2000)]
    assert min(delays) >= 500 and max(delays) <= 1000
    # A thousand executions failing together come back spread over the whole half, not as one wave.
    buckets = {d // 50 for d in delays}
    assert len(buckets) == 10


def test_a_stored_policy_is_read_from_its_camel_case_json_with_the_apis_defaults() -> None:
    assert RetryPolicy.from_json(
        {"maxAttempts": 5, "backoff": "LINEAR", "initialDelayMs": 10, "maxDelayMs": 99, "jitter": False}
    ) == RetryPolicy(5, "LINEAR", 10, 99, False)
    assert RetryPolicy.from_json({}) == RetryPolicy()
    assert RetryPolicy.from_json(None).max_attempts == 3
    # A row written by something else must never stop a retry: nonsense falls back to the defaults.
    assert RetryPolicy.from_json({"backoff": "SOMETIMES"}) == RetryPolicy()


def test_signal_keys_are_the_ones_every_process_uses() -> None:
    execution_id = uuid.UUID(int=1)
    assert heartbeat_key(execution_id) == "sundial:hb:00000000-0000-0000-0000-000000000001"
    # The dispatcher (CANCEL_RUNNING) and the API write the flag the worker reads.
    assert cancel_key(execution_id) == CANCEL_KEY.format(execution_id=execution_id)


def test_a_claim_returns_jobs_and_retries_and_drops_what_it_does_not_know() -> None:
    from sundial_common.hotwindow.window import member, parse_claimed, retry_member
    from sundial_common.runtime.clock import from_ms
    from sundial_common.stores.types import Occurrence, RetryDue

    job, execution = uuid.UUID(int=1), uuid.UUID(int=2)
    flat = [member(job).encode(), b"1000", retry_member(execution).encode(), b"2000", b"x:whatever", b"3000"]
    claimed = parse_claimed(flat)
    assert claimed.jobs == [Occurrence(job, from_ms(1000))]
    assert claimed.retries == [RetryDue(execution, from_ms(2000))]
    assert len(claimed) == 2
