"""Time-zone rule updates: when a zone's rules change under stored next fires, recompute them once.

Governments move DST dates, and an upgrade brings new tzdata. A CRON job's stored next fire was computed under
the rules of the process that computed it; after the rules change it may be an hour off. The active hydrator
(one at a time: it is elected) compares a fingerprint of the rules it reads for each zone in use with the one
recorded for that zone (``zone_rules``); for each zone that changed it recomputes the next fire of every CRON
job of that zone from the last occurrence the job ran, moves the ones that differ (each with an audit row
``reschedule``, and in the hot window), records the new fingerprint and logs the counts — before its first
hydrate pass, so the occurrences it promotes are the recomputed ones. An occurrence the new rules put in the
past fires late under the job's catch-up policy rather than being skipped; one already run never runs again
(the recomputation starts after it). A zone seen for the first time is recorded as it is.
"""

from __future__ import annotations

import hashlib
import logging
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

from sundial_common.domain.schedules import fire_at, next_fire, spec_from_row
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores.types import Occurrence
from sundial_common.stores.zone_rules import ZoneRuleStore

log = logging.getLogger(__name__)
REASON = "time-zone rules changed"


def fingerprint(zone: str) -> str:
    """A hash of the compiled rules (TZif) this process's ``zoneinfo`` reads for ``zone``."""
    for root in zoneinfo.TZPATH:
        path = Path(root) / zone
        if path.is_file():
            return hashlib.sha256(path.read_bytes()).hexdigest()
    try:  # the tzdata package, zoneinfo's fallback when the system has no zone files
        package = resources.files("tzdata.zoneinfo").joinpath(*zone.split("/"))
        return hashlib.sha256(package.read_bytes()).hexdigest()
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        return "missing"


@dataclass
class Reconciled:
    zones_changed: int = 0
    jobs_checked: int = 0
    jobs_moved: int = 0


class ZoneRules:
    def __init__(self, store: ZoneRuleStore, hot_window: HotWindow, hot_window_sec: int) -> None:
        self.store = store
        self.hot_window = hot_window
        self.hot_window_sec = hot_window_sec

    async def reconcile(self, now: datetime | None = None) -> Reconciled:
        """Recompute the next fires of the zones whose rules changed since they were recorded."""
        now = now or datetime.now(UTC)
        recorded = await self.store.recorded()
        done = Reconciled()
        for zone in await self.store.zones_in_use():
            current = fingerprint(zone)
            if recorded.get(zone) == current:
                continue
            if zone in recorded:
                zoneinfo.ZoneInfo.clear_cache(only_keys=[zone])  # read the new rules, not the cached ones
                done.zones_changed += 1
                checked, moved = await self._recompute(zone, now)
                done.jobs_checked += checked
                done.jobs_moved += moved
                log.warning("zone %s: rules changed; %d of %d CRON jobs' next fires moved", zone, moved, checked)
            await self.store.record(zone, current)
        return done

    async def _recompute(self, zone: str, now: datetime) -> tuple[int, int]:
        rows = await self.store.scheduled_in_zone(zone)
        moved = 0
        for row in rows:
            spec = spec_from_row(row)
            nominal = next_fire(spec, row["last_nominal"], row["fire_count"])
            if nominal is None or nominal == row["next_nominal_at"]:
                continue
            due = fire_at(row["id"], nominal, spec.jitter_sec)
            changed = await self.store.reschedule(row["id"], row["next_fire_at"], nominal, due, REASON)
            if changed is None:
                continue  # changed meanwhile (an edit, a fire): whoever did it computed under the new rules
            moved += 1
            if changed["state"] == "ACTIVE" and due < now + timedelta(seconds=self.hot_window_sec):
                await self.hot_window.add(changed["shard"], [Occurrence(row["id"], due)])
            else:
                await self.hot_window.remove(changed["shard"], [row["id"]])
        return len(rows), moved
