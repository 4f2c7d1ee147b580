"""The cluster view (`GET /v1/admin/cluster`): replicas, shard leaders and fence tokens, singleton roles."""

from __future__ import annotations

from sundial_client.models.admin import ClusterView, ReplicaView, RoleView, ShardView
