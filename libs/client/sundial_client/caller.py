"""What an API namespace (``client.jobs``, ``client.executions``, …) needs of its client, and paging.

A namespace is written once, over :class:`Caller`: :class:`~sundial_client.async_client.AsyncClient` is one,
and the blocking :class:`~sundial_client.client.Client` runs the same namespaces on its own event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

from sundial_client.calls import MAX_PAGE, Call

T = TypeVar("T")
Item = TypeVar("Item", covariant=True)


class Caller(Protocol):
    """Sends one operation (with the client's retries) and waits as the client was told to."""

    async def call(self, call: Call[T]) -> T: ...

    async def sleep(self, seconds: float) -> None: ...


class Page(Protocol, Generic[Item]):
    """A page of a listing: its items and the cursor of the next page (None on the last)."""

    @property
    def items(self) -> Sequence[Item]: ...

    @property
    def next_cursor(self) -> str | None: ...


def check_page_size(page_size: int, largest: int = MAX_PAGE) -> int:
    if not 1 <= page_size <= largest:
        raise ValueError(f"page_size must be 1 to {largest}, not {page_size}")
    return page_size


async def pages(client: Caller, page: Callable[[str | None], Call[Page[T]]]) -> AsyncIterator[T]:
    """Every item of a listing, the next page fetched (``page(cursor)``) when the previous one is used up."""
    cursor: str | None = None
    while True:
        answer = await client.call(page(cursor))
        for item in answer.items:
            yield item
        if answer.next_cursor is None:
            return
        cursor = answer.next_cursor


#: A coroutine function of no argument: how a namespace waits between polls.
Sleep = Callable[[float], Awaitable[None]]
