"""The API's change feed (one per process, for the console's live regions), on an in-memory audit log."""

from __future__ import annotations

import asyncio

import pytest
from sundial_api.change_feed import ChangeFeed


class FakeAudit:
    """Audit rows as (id, tenant); answers the two questions the feed asks."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str]] = []

    def add(self, tenant: str, ident: int | None = None) -> None:
        self.rows.append((ident if ident is not None else max((i for i, _ in self.rows), default=0) + 1, tenant))

    async def newest_id(self) -> int:
        return max((i for i, _ in self.rows), default=0)

    async def changes_since(self, after: int) -> tuple[dict[str, tuple[int, int]], int]:
        changes: dict[str, tuple[int, int]] = {}
        for ident, tenant in self.rows:
            if ident > after:
                count, total = changes.get(tenant, (0, 0))
                changes[tenant] = (count + 1, total + ident)
        return changes, max((i for i, _ in self.rows if i > after), default=after)


async def test_a_tenants_version_changes_with_its_rows_only() -> None:
    audit = FakeAudit()
    audit.add("acme")
    feed = ChangeFeed(audit, window_polls=3)  # type: ignore[arg-type]
    await feed.run_once()
    acme, other = feed.version("acme"), feed.version("other")
    await feed.run_once()
    assert (feed.version("acme"), feed.version("other")) == (acme, other)
    audit.add("other")
    await feed.run_once()
    assert feed.version("acme") == acme and feed.version("other") != other
    await feed.stop()


async def test_a_row_committed_late_under_a_lower_id_still_counts() -> None:
    audit = FakeAudit()
    audit.add("acme", 10)
    feed = ChangeFeed(audit, window_polls=5)  # type: ignore[arg-type]
    await feed.run_once()
    audit.add("acme", 12)
    await feed.run_once()
    before = feed.version("acme")
    audit.add("acme", 11)  # took its id before 12, committed after the poll that saw 12
    await feed.run_once()
    assert feed.version("acme") != before
    await feed.stop()


async def test_asking_starts_the_feed_and_it_stops_when_told() -> None:
    audit = FakeAudit()
    feed = ChangeFeed(audit, interval_sec=0.01)  # type: ignore[arg-type]
    assert feed.version("acme") is None  # not polled yet: pages read as if it changed
    for _ in range(200):
        if feed.version("acme") is not None:
            break
        await asyncio.sleep(0.01)
    assert feed.version("acme") == "0"
    await feed.stop()
    await feed.stop()  # twice is fine


def test_settings_are_checked_where_the_feed_is_built() -> None:
    with pytest.raises(ValueError, match="positive"):
        ChangeFeed(FakeAudit(), interval_sec=0)  # type: ignore[arg-type]
