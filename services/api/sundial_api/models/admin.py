"""The cluster view (`GET /v1/admin/cluster`): replicas, shard leaders and fence tokens, singleton roles.

Defined in :mod:`sundial_client.models.admin` (the views are defined once, for the API and the client).
"""

from __future__ import annotations

from sundial_client.models.admin import ClusterView, ReplicaView, RoleView, ShardView
