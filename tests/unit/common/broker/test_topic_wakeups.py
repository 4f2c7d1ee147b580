"""The dispatcher's topic wake-ups: announced after an acknowledged batch, at most once per interval a topic."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, cast

from redis.asyncio import Redis
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.broker.wakeups import WakingPublisher, topic_wake_channel
from sundial_common.testing import FakeClock

from tests.support.messages import execution_message


class _Pipeline:
    def __init__(self, sent: list[str]) -> None:
        self.sent = sent
        self.queued: list[str] = []

    async def __aenter__(self) -> _Pipeline:
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        return None

    def publish(self, channel: str, _message: bytes) -> None:
        self.queued.append(channel)

    async def execute(self) -> None:
        self.sent += self.queued


class _Redis:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self.sent)


class _Acks:
    """A broker that acknowledges every message but those of the pool ``refused``."""

    refused = "refused"

    async def publish(self, messages: Sequence[ExecutionMessage]) -> list[Exception | None]:
        return [RuntimeError("no") if m.pool == self.refused else None for m in messages]

    async def close(self) -> None:
        return None


async def test_a_topic_is_announced_at_most_once_per_interval_and_only_for_acknowledged_batches() -> None:
    redis, clock = _Redis(), FakeClock(monotonic=0.0)  # from 0: 0.05 + 0.05 is exactly the 0.1 s interval
    publisher = WakingPublisher(_Acks(), cast(Redis, cast(Any, redis)), min_interval_sec=0.1, clock=clock.monotonic)
    a, b = topic_wake_channel(execution_message("a").topic), topic_wake_channel(execution_message("b").topic)

    await publisher.publish([execution_message("a"), execution_message("a")])
    assert redis.sent == [a]
    clock.advance(0.05)  # a was announced 50 ms ago: its woken workers are still fetching
    await publisher.publish([execution_message("a"), execution_message("b"), execution_message("refused")])
    assert redis.sent == [a, b]
    clock.advance(0.05)
    await publisher.publish([execution_message("a")])
    assert redis.sent == [a, b, a]
