"""The bridge from blocking code to the asynchronous client: one event loop in a thread of its own.

:class:`~sundial_client.client.Client` is :class:`~sundial_client.async_client.AsyncClient` run on a
:class:`LoopThread`: each blocking call submits its coroutine to that loop and waits for the answer, so an
operation, its retries and its paging are written once. The loop lives in its own (daemon) thread, so a
blocking client works from any thread — several at once — and from code that itself runs an event loop.

:func:`blocking` and :func:`blocking_iter` make a namespace's blocking methods from its asynchronous ones, with
the same parameters and documentation: ``get = blocking(AsyncJobs.get)``.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

P = ParamSpec("P")
R = TypeVar("R")


class LoopThread:
    """An event loop running in a daemon thread, started at the first :meth:`run`; :meth:`close` stops it."""

    def __init__(self, name: str = "sundial-client") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def start(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                self.thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                self.thread.start()
                self.loop = loop
            return self.loop

    @property
    def started(self) -> bool:
        return self.loop is not None

    def run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        """Run ``coroutine`` on the loop and wait for its result (its exception is raised here)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.start())
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted (Ctrl-C) while waiting: do not leave the call running behind
            raise

    def close(self) -> None:
        """Stop the loop and its thread; safe before a start and twice."""
        with self.lock:
            loop, thread, self.loop, self.thread = self.loop, self.thread, None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is threading.current_thread():
            return  # collected on the loop's own thread: it ends when this callback returns
        thread.join()
        loop.close()


class Blocking:
    """A blocking view of one asynchronous namespace: its methods are :func:`blocking` ones."""

    def __init__(self, bridge: LoopThread, inner: Any) -> None:
        self.bridge = bridge
        self.inner = inner


def blocking(method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> Callable[Concatenate[Blocking, P], R]:
    """The blocking form of an asynchronous namespace method: same parameters, same documentation."""

    def run(self: Blocking, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.bridge.run(method(self.inner, *args, **kwargs))

    functools.update_wrapper(run, method)
    return run


def blocking_iter(
    method: Callable[Concatenate[Any, P], AsyncIterator[R]],
) -> Callable[Concatenate[Blocking, P], Iterator[R]]:
    """The blocking form of a method answering an async iterator (a listing): an iterator that fetches as it goes."""

    def run(self: Blocking, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[R]:
        return iterate(self.bridge, method(self.inner, *args, **kwargs))

    functools.update_wrapper(run, method)
    return run


def iterate(bridge: LoopThread, items: AsyncIterator[R]) -> Iterator[R]:
    """``items`` one by one, each fetched on the bridge's loop; closed (on the loop) when abandoned."""

    async def step() -> R:
        return await anext(items)

    async def close() -> None:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()

    exhausted = False
    try:
        while True:
            try:
                yield bridge.run(step())
            except StopAsyncIteration:
                exhausted = True
                return
    finally:
        if not exhausted and bridge.started:
            bridge.run(close())  # abandoned part way (break, islice): let the listing clean up


class BlockingTransport(httpx.AsyncBaseTransport):
    """A blocking httpx transport (a test's or a proxy's) under the asynchronous client; it runs on the loop's
    thread, which serves this client alone. The response is read whole, its bytes handed on as they came."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = self.transport.handle_request(request)
        try:
            raw = response.content  # an answer made in memory (a test's) is read already, its bytes as given
        except httpx.ResponseNotRead:
            try:
                raw = b"".join(response.iter_raw())
            finally:
                response.close()
        return httpx.Response(
            response.status_code, headers=response.headers, content=raw, extensions=response.extensions
        )

    async def aclose(self) -> None:
        self.transport.close()


def async_transport(
    transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None,
) -> httpx.AsyncBaseTransport | None:
    if transport is None or isinstance(transport, httpx.AsyncBaseTransport):
        return transport  # httpx.MockTransport is both kinds
    return BlockingTransport(transport)


def async_sleep(sleep: Callable[[float], object] | None) -> Callable[[float], Coroutine[Any, Any, None]]:
    """A blocking client's ``sleep=`` (``time.sleep``, or a test's recorder) as the coroutine the loop awaits."""
    if sleep is None:
        return asyncio.sleep

    async def wait(seconds: float) -> None:
        sleep(seconds)

    return wait
