"""The operator's cluster view (`GET /v1/admin/cluster`): replicas, shard leaders, fences, leases."""

from __future__ import annotations

from pydantic import Field

from sundial_client.models.common import ViewModel


class ReplicaView(ViewModel):
    id: str = Field(description="The replica's id (`SUNDIAL_INSTANCE_ID`, by default host-pid).")
    kind: str = Field(description="`api`, `dispatcher`, `hydrator`, `sweeper` or `analytics`.")
    host: str
    pid: int
    started_at: str
    last_heartbeat_at: str = Field(
        description="When the replica last renewed its registry entry's lease (every TTL/3)."
    )
    leads_shards: list[int] = Field(description="Shards this dispatcher replica leads now.")
    roles: list[str] = Field(description="Singleton roles this replica is the active one for.")


class ShardView(ViewModel):
    shard: int
    leader: str | None = Field(description="The replica leading the shard; null between terms.")
    fence_token: int | None = Field(
        description="The leader's fencing token, issued by Postgres when its term took the shard (null until then)."
    )
    recorded_fence: int | None = Field(description="The highest fencing token issued for the shard (Postgres).")
    lease_ttl_sec: int | None = Field(description="Seconds left on the leader's lease (whole seconds).")
    hot_window_size: int | None = Field(description="Occurrences in the shard's Redis hot window.")
    handover_to: str | None = Field(description="The replica that asked the leader to hand the shard over, if any.")


class RoleView(ViewModel):
    role: str
    leader: str | None
    fence_token: int | None
    lease_ttl_sec: int | None


class ClusterView(ViewModel):
    generated_at: str
    shard_count: int
    replicas: list[ReplicaView]
    shards: list[ShardView]
    roles: list[RoleView]
    errors: dict[str, str] = Field(description="Sources that did not answer (`postgres`, `redis`) and why.")
