"""A time-zone rule change under stored next fires: the hydrator recomputes them once, from the last
occurrence run, with an audit row each, and the hot window follows; nothing already run fires again."""

from __future__ import annotations

import shutil
import subprocess
import uuid
import zoneinfo
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.stores.zone_rules import PostgresZoneRuleStore
from sundial_hydrator.zone_rules import ZoneRules

ZONE = "Sundial/Shift"


def compile_zone(root: Path, offset: str) -> Path:
    """A zone whose clocks are ``offset`` hours from UTC, compiled by zic under ``root``."""
    root.mkdir(parents=True)
    source = root / "zone.txt"
    source.write_text(f"Zone {ZONE} {offset}:00 - +{int(offset):02d}\n")
    zic = shutil.which("zic") or "/usr/sbin/zic"
    subprocess.run([zic, "-d", str(root), str(source)], check=True, capture_output=True)
    return root


def next_at_hour(now: datetime, hour: int) -> datetime:
    """The first whole ``hour`` (UTC) after ``now``."""
    at = now.replace(hour=hour, minute=0, second=0)
    return at if at > now else at + timedelta(days=1)


@pytest.fixture
def rules(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The zone's rules before and after a government moved its clocks an hour forward for good."""
    before, after = compile_zone(tmp_path / "before", "1"), compile_zone(tmp_path / "after", "2")
    try:
        yield before, after
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()


def use(root: Path) -> None:
    zoneinfo.reset_tzpath([str(root)])
    zoneinfo.ZoneInfo.clear_cache()


@pytest.fixture
async def hot_window(redis_url: str) -> AsyncIterator[HotWindow]:
    redis = Redis.from_url(redis_url)
    yield HotWindow(redis)
    await redis.aclose()


async def test_a_rule_change_moves_next_fires_once_and_audits_each(
    stores: Stores, hot_window: HotWindow, database_url: str, rules: tuple[Path, Path]
) -> None:
    before, after = rules
    use(before)
    now = datetime.now(UTC).replace(microsecond=0)
    # The next 03:00 of the zone from now (the job's creation: it has run nothing yet), under each rule.
    three_am_before, three_am_after = next_at_hour(now, 2), next_at_hour(now, 1)  # 03:00 at +01, at +02
    job = new_id()
    await stores.jobs.insert_job(
        {
            "id": job,
            "tenant_id": "acme",
            "name": "nightly",
            "type": "CRON",
            "schedule": "0 3 * * *",
            "timezone": ZONE,
            "pool": f"t-{uuid.uuid4().hex[:8]}",
            "handler": "echo",
            "payload": {},
            "timeout_sec": 30,
            "shard": 0,
            "next_nominal_at": three_am_before,
            "next_fire_at": three_am_before,
        },
        actor="test",
    )
    zone_rules = ZoneRules(PostgresZoneRuleStore(stores.database), hot_window, hot_window_sec=3 * 86400)

    first = await zone_rules.reconcile(now)  # first sight of the zone: recorded, nothing moved
    assert (first.zones_changed, first.jobs_moved) == (0, 0)

    use(after)
    moved = await zone_rules.reconcile(now)
    again = await zone_rules.reconcile(now)

    assert (moved.zones_changed, moved.jobs_checked, moved.jobs_moved) == (1, 1, 1)
    assert (again.zones_changed, again.jobs_moved) == (0, 0)  # once: the new rules are recorded
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow("SELECT next_nominal_at, next_fire_at FROM jobs WHERE id = $1", job)
        audit = await connection.fetch(
            "SELECT action, detail FROM audit_log WHERE entity_id = $1 AND action = 'reschedule'", job
        )
    finally:
        await connection.close()
    assert (row["next_nominal_at"], row["next_fire_at"]) == (three_am_after, three_am_after)
    assert len(audit) == 1 and "time-zone rules changed" in audit[0]["detail"]
    [occurrence] = await hot_window.claim(0, three_am_after, 10)
    assert (occurrence.job_id, occurrence.due) == (job, three_am_after)
