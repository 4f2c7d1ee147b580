"""The worker SDK: pool and handler validation, handler kinds, config validation, result encoding."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from sundial_common.hotwindow.execution_signals import heartbeat_key
from sundial_worker import Context, Worker, WorkerConfig
from sundial_worker.cli import AppError, load_worker
from sundial_worker.invocation import encode_result, error_text
from sundial_worker.sdk import HandlerRegistry


def test_handlers_register_by_name_and_know_whether_they_are_async() -> None:
    worker = Worker(pool="email-sender", concurrency=4)

    @worker.handler("send_welcome")
    async def send_welcome(ctx: Context, payload: Any) -> None:
        return None

    @worker.handler("resize")
    def resize(ctx: Context, payload: Any) -> int:
        return 1

    assert worker.registry.names() == ["resize", "send_welcome"]
    assert worker.handlers["send_welcome"].is_async
    assert not worker.handlers["resize"].is_async
    assert worker.handlers["resize"].func is resize  # the decorator returns the function unchanged


def test_a_callable_object_with_async_call_is_async() -> None:
    class Handler:
        async def __call__(self, ctx: Context, payload: Any) -> None:
            return None

    registry = HandlerRegistry("p")
    assert registry.register("h", Handler()).is_async


def test_duplicate_handler_name_is_a_clear_error() -> None:
    worker = Worker(pool="demo")

    @worker.handler("echo")
    async def echo(ctx: Context, payload: Any) -> Any:
        return payload

    with pytest.raises(ValueError, match=r"'echo' is already registered on pool 'demo'.*echo"):

        @worker.handler("echo")
        async def echo_again(ctx: Context, payload: Any) -> Any:
            return payload


@pytest.mark.parametrize("pool", ["", "Email", "-lead", "has space", "x" * 64, "sundial/pool"])
def test_invalid_pool_names_are_rejected(pool: str) -> None:
    with pytest.raises(ValueError, match="invalid pool name"):
        Worker(pool=pool)


@pytest.mark.parametrize("concurrency", [0, -1, True, 1.5])
def test_concurrency_must_be_a_positive_integer(concurrency: Any) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Worker(pool="demo", concurrency=concurrency)


@pytest.mark.parametrize("name", ["", " echo", "x" * 201])
def test_invalid_handler_names_fail_at_the_decorator(name: str) -> None:
    with pytest.raises(ValueError, match="handler name"):
        Worker(pool="demo").handler(name)


def test_bare_decorator_is_explained() -> None:
    worker = Worker(pool="demo")
    with pytest.raises(TypeError, match="needs the handler's name"):
        worker.handler(lambda ctx, payload: None)  # type: ignore[arg-type]


def test_unknown_handler_error_lists_what_is_registered() -> None:
    worker = Worker(pool="demo")
    worker.handler("echo")(lambda ctx, payload: payload)
    assert worker.registry.unknown_handler_error("ehco") == (
        "UnknownHandler: pool 'demo' has no handler 'ehco' (registered: echo)"
    )


async def test_context_heartbeat_keeps_the_last_progress_and_cancelled_reads_the_flag() -> None:
    calls: list[Any] = []

    class Sink:
        async def heartbeat(self, ctx: Context, progress: Any | None) -> None:
            calls.append(progress)

    ctx = Context(
        execution_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        tenant="acme",
        attempt=1,
        fence_token=3,
        scheduled_for=datetime.now(UTC),
        handler="h",
        pool="demo",
        trace_id=None,
        logger=logging.LoggerAdapter(logging.getLogger("t"), {}),
        _sink=Sink(),
    )
    await ctx.heartbeat(progress={"sent": 10})
    await ctx.heartbeat()
    assert calls == [{"sent": 10}, None]
    assert ctx.progress == {"sent": 10}
    assert ctx.previous_progress is None
    assert not ctx.cancelled
    ctx.request_cancel()
    assert ctx.cancelled


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"poll_batch": 0}, "poll_batch"),
        ({"heartbeat_interval_sec": 0}, "heartbeat_interval_sec"),
        ({"heartbeat_interval_sec": 30, "heartbeat_ttl_sec": 30}, "heartbeat_ttl_sec"),
        ({"shutdown_grace_sec": -1}, "shutdown_grace_sec"),
        ({"flush_max_outcomes": 0}, "flush_max_outcomes"),
    ],
)
def test_worker_config_names_the_bad_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WorkerConfig(**kwargs)


def test_results_are_encoded_once_and_bad_ones_are_explained() -> None:
    encoded, problem = encode_result({"a": [1, 2]})
    assert problem is None and orjson.dumps(encoded) == b'{"a":[1,2]}'
    assert encode_result(None) == (None, None)
    _, problem = encode_result({"when": object()})
    assert problem is not None and problem.startswith("TypeError: handler result is not JSON-serializable")
    _, problem = encode_result({"s": "nul\x00byte"})
    assert problem is not None and "NUL" in problem
    # An escaped backslash followed by the text u0000 is not a NUL character.
    assert encode_result({"s": "\\u0000"})[1] is None


def test_error_text_is_type_and_message_and_bounded() -> None:
    assert error_text(RuntimeError("demo failure")) == "RuntimeError: demo failure"
    assert len(error_text(ValueError("x" * 100_000))) == 8192


def test_heartbeat_key() -> None:
    execution_id = uuid.UUID(int=1)
    assert heartbeat_key(execution_id) == "sundial:hb:00000000-0000-0000-0000-000000000001"


def test_load_worker_finds_the_demo_and_explains_mistakes() -> None:
    worker = load_worker("sundial_worker.demo:worker")
    assert worker.pool == "demo" and worker.registry.names() == ["echo", "fail", "flaky", "outage", "sleep"]
    assert load_worker("sundial_worker.demo") is worker
    with pytest.raises(AppError, match="no module named 'no_such_module'"):
        load_worker("no_such_module:worker")
    with pytest.raises(AppError, match="has no attribute 'nope'"):
        load_worker("sundial_worker.demo:nope")
    with pytest.raises(AppError, match=r"not a sundial_worker\.Worker"):
        load_worker("sundial_worker.demo:echo")
