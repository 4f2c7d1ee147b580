"""The cluster snapshot's two renderings — the admin API's JSON and `sundial cluster`'s table — and their config."""

from __future__ import annotations

import pytest
from sundial_api.models.admin import ClusterView
from sundial_common.coordination.cluster import ClusterState, ReplicaState, RoleState, ShardState
from sundial_common.coordination.registry import ClusterKeys, ReplicaRecord
from sundial_dispatcher.shards import CampaignConfig


def snapshot() -> ClusterState:
    record = ReplicaRecord(
        id="dispatcher-1",
        kind="dispatcher",
        host="vm",
        pid=42,
        started="2026-11-21T07:00:00.000Z",
        heartbeat="2026-11-21T07:00:05.000Z",
    )
    return ClusterState(
        generated_at="2026-11-21T07:00:06.000Z",
        shards=(
            ShardState(0, "dispatcher-1", 17, 17, 4, 12, None),
            ShardState(1, None, None, 9, None, None, "dispatcher-2"),
        ),
        replicas=(ReplicaState(record, leads=(0,), roles=()),),
        roles=(RoleState("hydrator", None, None, None),),
        errors={"redis": "TimeoutError: "},
    )


def test_the_json_body_is_exactly_what_the_openapi_model_documents() -> None:
    body = snapshot().to_json()
    view = ClusterView.model_validate(body)
    assert view.model_dump(by_alias=True) == body
    assert body["replicas"][0]["leadsShards"] == [0]
    assert body["shards"][1] == {
        "shard": 1,
        "leader": None,
        "fenceToken": None,
        "recordedFence": 9,
        "leaseTtlSec": None,
        "hotWindowSize": None,
        "handoverTo": "dispatcher-2",
    }


def test_the_table_shows_every_replica_shard_role_and_error() -> None:
    table = snapshot().table()
    lines = table.splitlines()
    assert lines[0] == "Sundial cluster at 2026-11-21T07:00:06.000Z: 1 replicas, 2 shards"
    header = next(line for line in lines if line.startswith("REPLICA"))
    assert header.split() == ["REPLICA", "KIND", "HOST", "PID", "STARTED", "LAST", "HEARTBEAT", "LEADS"]
    assert any(line.split() == ["0", "dispatcher-1", "17", "17", "4s", "12", "-"] for line in lines)
    assert any(line.split() == ["1", "-", "-", "9", "-", "-", "dispatcher-2"] for line in lines)
    assert any(line.split() == ["hydrator", "-", "-", "-"] for line in lines)
    assert "redis did not answer: TimeoutError" in table


def test_cluster_keys_and_campaign_config_refuse_what_would_break_them() -> None:
    keys = ClusterKeys()
    assert keys.shard_prefix == "/sundial/shards/"
    assert keys.successor(3) == b"/sundial/shards/3/successor"
    assert keys.replica("dispatcher", "d-1") == b"/sundial/replicas/dispatcher/d-1"
    assert keys.role_prefix("sweeper") == "/sundial/roles/sweeper/"
    with pytest.raises(ValueError, match="start and end with '/'"):
        ClusterKeys("/sundial")
    with pytest.raises(ValueError, match="role must be a non-empty name"):
        keys.role_prefix("a/b")
    with pytest.raises(ValueError, match="orphan_grace_sec must be > 0"):
        CampaignConfig(shards=8, orphan_grace_sec=0)
    with pytest.raises(ValueError, match="shards must be >= 1"):
        CampaignConfig(shards=0)
