"""A snapshot of the cluster for operators: live replicas, who leads each shard and role, fences, backlogs.

``GET /v1/admin/cluster`` and ``sundial cluster`` both show :func:`read_cluster`'s answer, read from where
each fact lives: replicas and leaders from etcd (the registry and the leader keys, with each leader
lease's remaining TTL), the fence each shard has actually written with from Postgres (``shard_fence``),
and each shard's hot-window size from Redis. etcd is required; if Postgres or Redis does not answer,
their columns are empty and ``errors`` says why — an operator looking at a sick cluster still sees it.

A shard whose leader ``fenceToken`` is above its ``recordedFence`` has a new leader that has not
dispatched yet; a shard with no leader is between terms (or orphaned, if it stays so).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import aetcd

from sundial_common.coordination.registry import ClusterKeys, ReplicaRecord
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores.dispatch import DispatchStore

__all__ = ["ROLES", "ClusterState", "ReplicaState", "RoleState", "ShardState", "read_cluster"]

ROLES = ("hydrator", "sweeper", "replayer", "analytics")
"""Singleton roles elected in etcd (one active replica each)."""

# Redis and Postgres are asked with a deadline: a snapshot of a sick cluster must still come back.
_SIDE_SOURCE_TIMEOUT_SEC = 2.0


@dataclass(frozen=True)
class ShardState:
    shard: int
    leader: str | None
    fence_token: int | None
    """The current leader's fencing token: the one its term took in Postgres (None until it has)."""
    recorded_fence: int | None
    """The highest token issued for the shard (``shard_fence``)."""
    lease_ttl_sec: int | None
    """Seconds left on the leader's lease as etcd counts them (whole seconds)."""
    hot_window_size: int | None
    successor: str | None
    """A replica that asked the leader to hand the shard over, if any."""


@dataclass(frozen=True)
class RoleState:
    role: str
    leader: str | None
    fence_token: int | None
    lease_ttl_sec: int | None


@dataclass(frozen=True)
class ReplicaState:
    record: ReplicaRecord
    leads: tuple[int, ...]
    roles: tuple[str, ...]


@dataclass(frozen=True)
class ClusterState:
    generated_at: str
    shards: tuple[ShardState, ...]
    replicas: tuple[ReplicaState, ...]
    roles: tuple[RoleState, ...]
    errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The admin API's body (camelCase)."""
        return {
            "generatedAt": self.generated_at,
            "shardCount": len(self.shards),
            "replicas": [
                {
                    "id": r.record.id,
                    "kind": r.record.kind,
                    "host": r.record.host,
                    "pid": r.record.pid,
                    "startedAt": r.record.started,
                    "lastHeartbeatAt": r.record.heartbeat,
                    "leadsShards": list(r.leads),
                    "roles": list(r.roles),
                }
                for r in self.replicas
            ],
            "shards": [
                {
                    "shard": s.shard,
                    "leader": s.leader,
                    "fenceToken": s.fence_token,
                    "recordedFence": s.recorded_fence,
                    "leaseTtlSec": s.lease_ttl_sec,
                    "hotWindowSize": s.hot_window_size,
                    "handoverTo": s.successor,
                }
                for s in self.shards
            ],
            "roles": [
                {"role": r.role, "leader": r.leader, "fenceToken": r.fence_token, "leaseTtlSec": r.lease_ttl_sec}
                for r in self.roles
            ],
            "errors": dict(self.errors),
        }

    def table(self) -> str:
        """The same, for a terminal (``sundial cluster``)."""

        def cell(value: object) -> str:
            return "-" if value is None else str(value)

        def render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
            widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
            lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
            lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
            return lines

        out = [f"Sundial cluster at {self.generated_at}: {len(self.replicas)} replicas, {len(self.shards)} shards", ""]
        out += render(
            ("REPLICA", "KIND", "HOST", "PID", "STARTED", "LAST HEARTBEAT", "LEADS"),
            [
                (
                    r.record.id,
                    r.record.kind,
                    r.record.host,
                    str(r.record.pid),
                    r.record.started,
                    r.record.heartbeat,
                    ",".join([*(str(s) for s in r.leads), *r.roles]) or "-",
                )
                for r in self.replicas
            ],
        )
        out.append("")
        out += render(
            ("SHARD", "LEADER", "FENCE TOKEN", "RECORDED FENCE", "LEASE TTL", "HOT WINDOW", "HANDOVER TO"),
            [
                (
                    str(s.shard),
                    cell(s.leader),
                    cell(s.fence_token),
                    cell(s.recorded_fence),
                    "-" if s.lease_ttl_sec is None else f"{s.lease_ttl_sec}s",
                    cell(s.hot_window_size),
                    cell(s.successor),
                )
                for s in self.shards
            ],
        )
        out.append("")
        out += render(
            ("ROLE", "ACTIVE REPLICA", "FENCE TOKEN", "LEASE TTL"),
            [
                (
                    r.role,
                    cell(r.leader),
                    cell(r.fence_token),
                    "-" if r.lease_ttl_sec is None else f"{r.lease_ttl_sec}s",
                )
                for r in self.roles
            ],
        )
        for source, error in self.errors.items():
            out.append(f"\n{source} did not answer: {error}")
        return "\n".join(out)


@dataclass(frozen=True)
class _Leader:
    holder: str
    token: int
    lease: int


async def _lease_ttl(etcd: aetcd.Client, lease: int) -> int | None:
    if not lease:
        return None
    info = await etcd.get_lease_info(lease, keys=False)
    return int(info.TTL) if info.TTL >= 0 else None  # -1: the lease expired between the two reads


async def _lease_age(etcd: aetcd.Client, lease: int) -> int | None:
    """Seconds since ``lease`` was last renewed (granted TTL minus the TTL left); None if it is gone."""
    if not lease:
        return None
    info = await etcd.get_lease_info(lease, keys=False)
    return max(0, int(info.grantedTTL) - int(info.TTL)) if info.TTL >= 0 else None


def _iso(instant: datetime) -> str:
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def _bounded(source: str, work: Any, errors: dict[str, str]) -> Any:
    try:
        return await asyncio.wait_for(work, _SIDE_SOURCE_TIMEOUT_SEC)
    except Exception as exc:  # whatever went wrong there, the rest of the snapshot is still worth showing
        errors[source] = f"{type(exc).__name__}: {exc}"[:300] or type(exc).__name__
        return None


async def read_cluster(
    etcd: aetcd.Client,
    shards: int,
    *,
    hot_window: HotWindow | None = None,
    dispatch: DispatchStore | None = None,
    keys: ClusterKeys | None = None,
) -> ClusterState:
    """Read the snapshot (see the module docstring). Raises ``aetcd.ClientError`` if etcd does not answer."""
    keys = keys or ClusterKeys()
    errors: dict[str, str] = {}
    registry, shard_keys, role_keys = await asyncio.gather(
        etcd.get_prefix(keys.replicas()),
        etcd.get_prefix(keys.shard_prefix.encode()),
        etcd.get_prefix(keys.roles_prefix.encode()),
    )
    records = []
    record_leases = []
    for kv in registry:
        try:
            records.append(ReplicaRecord.decode(kv.value))
            record_leases.append(int(kv.lease))
        except (ValueError, KeyError, TypeError):
            errors.setdefault("registry", f"malformed entry {kv.key!r}")
    # A replica renews its entry's lease without rewriting the record (see sundial_common.coordination.registry): its
    # last renewal is the lease's granted TTL minus what is left of it, ago (etcd counts whole seconds, so
    # never before the registration the record's own heartbeat holds; same ISO format, so max() compares).
    read_at = datetime.now(UTC)
    renewed = await asyncio.gather(*(_lease_age(etcd, lease) for lease in record_leases))
    records = [
        replace(record, heartbeat=max(record.heartbeat, _iso(read_at - timedelta(seconds=age))))
        if age is not None
        else record
        for record, age in zip(records, renewed, strict=True)
    ]

    leaders: dict[int, _Leader] = {}
    successors: dict[int, str] = {}
    for kv in shard_keys:
        parts = kv.key.decode(errors="replace")[len(keys.shard_prefix) :].split("/")
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        shard, what = int(parts[0]), parts[1]
        if what == "leader":
            leaders[shard] = _Leader(kv.value.decode(errors="replace"), int(kv.create_revision), int(kv.lease))
        elif what == "successor":
            successors[shard] = kv.value.decode(errors="replace")
    role_leaders: dict[str, _Leader] = {}
    for kv in role_keys:
        parts = kv.key.decode(errors="replace")[len(keys.roles_prefix) :].split("/")
        if len(parts) == 3 and parts[2] == "leader":
            role_leaders[parts[0]] = _Leader(kv.value.decode(errors="replace"), int(kv.create_revision), int(kv.lease))

    shard_ids = range(shards)
    role_ids = sorted({*ROLES, *role_leaders})
    shard_ttls, role_ttls, sizes, fences = await asyncio.gather(
        asyncio.gather(*(_lease_ttl(etcd, leaders[s].lease) if s in leaders else _none() for s in shard_ids)),
        asyncio.gather(*(_lease_ttl(etcd, role_leaders[r].lease) if r in role_leaders else _none() for r in role_ids)),
        _bounded("redis", asyncio.gather(*(hot_window.size(s) for s in shard_ids)), errors)
        if hot_window is not None
        else _none(),
        _bounded("postgres", dispatch.shard_fences(), errors) if dispatch is not None else _none(),
    )
    recorded = {int(row["shard"]): int(row["token"]) for row in fences or ()}
    # A term's token is issued by Postgres when it takes the shard: the recorded fence, if the leader took it.
    taken_by = {int(row["shard"]): row["holder"] for row in fences or ()}

    shard_states = tuple(
        ShardState(
            shard=s,
            leader=leaders[s].holder if s in leaders else None,
            fence_token=recorded.get(s) if s in leaders and taken_by.get(s) == leaders[s].holder else None,
            recorded_fence=recorded.get(s),
            lease_ttl_sec=shard_ttls[s],
            hot_window_size=sizes[s] if sizes is not None else None,
            successor=successors.get(s),
        )
        for s in shard_ids
    )
    role_states = tuple(
        RoleState(
            role=r,
            leader=role_leaders[r].holder if r in role_leaders else None,
            fence_token=role_leaders[r].token if r in role_leaders else None,
            lease_ttl_sec=ttl,
        )
        for r, ttl in zip(role_ids, role_ttls, strict=True)
    )
    replicas = tuple(
        ReplicaState(
            record=record,
            leads=tuple(s for s in shard_ids if s in leaders and leaders[s].holder == record.id)
            if record.kind == "dispatcher"
            else (),
            roles=tuple(r.role for r in role_states if r.leader == record.id and r.role == record.kind),
        )
        for record in sorted(records, key=lambda r: (r.kind, r.id))
    )
    # Shards beyond the configured count (a cluster restarted with fewer shards) are worth a word.
    stray = sorted(s for s in leaders if s >= shards)
    if stray:
        errors["shards"] = f"leader keys exist for shards {stray} beyond the configured {shards}"
    return ClusterState(
        generated_at=_iso(datetime.now(UTC)),
        shards=shard_states,
        replicas=replicas,
        roles=role_states,
        errors=errors,
    )


async def _none() -> None:
    return None
