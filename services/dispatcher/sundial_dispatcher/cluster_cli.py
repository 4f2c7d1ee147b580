"""`sundial cluster`: print the cluster — replicas, shard leaders, fences, lease TTLs, hot-window sizes.

The same snapshot as ``GET /v1/admin/cluster`` (:mod:`sundial_common.coordination.cluster`), read straight from etcd,
Postgres and Redis rather than through the API, so it still works when no API replica does.
"""

from __future__ import annotations

import asyncio
import sys

import aetcd
import orjson
from redis.asyncio import Redis
from sundial_common.coordination.cluster import read_cluster
from sundial_common.coordination.registry import etcd_client
from sundial_common.hotwindow.window import HotWindow
from sundial_common.runtime.settings import CommonSettings, SettingsHelpParser, load_settings
from sundial_common.stores import Stores

# What the cluster view reads; its --help lists exactly these.
CLUSTER_FIELDS = ("etcd_endpoint", "database_url", "redis_url", "shards")


def main(argv: list[str] | None = None) -> int:
    """Show the cluster: replicas, who leads each shard and role, fence tokens, lease TTLs, hot-window sizes."""
    parser = SettingsHelpParser(
        settings=CommonSettings,
        fields=CLUSTER_FIELDS,
        prog="sundial cluster",
        description="Show the live replicas (id, kind, host, pid, started, last heartbeat) and, per shard, the "
        "leader replica, its fence token, the fence recorded in Postgres, the lease TTL left and the hot-window "
        "size.",
    )
    parser.add_argument("--json", action="store_true", help="Print the JSON body GET /v1/admin/cluster returns.")
    args = parser.parse_args(argv)
    settings = load_settings(CommonSettings, parser)

    async def show() -> int:
        etcd = etcd_client(settings.etcd_endpoint)
        redis = Redis.from_url(settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
        stores: Stores | None = None
        try:
            try:
                stores = await asyncio.wait_for(Stores.connect(settings.database_url, min_size=1, max_size=1), 5.0)
            except Exception as exc:  # Postgres down: show the rest, say so
                print(f"(Postgres unreachable: {type(exc).__name__}: {exc})", file=sys.stderr)
            try:
                state = await asyncio.wait_for(
                    read_cluster(
                        etcd, settings.shards, hot_window=HotWindow(redis), dispatch=stores.dispatch if stores else None
                    ),
                    10.0,
                )
            except (aetcd.ClientError, TimeoutError) as exc:
                print(f"sundial cluster: etcd at {settings.etcd_endpoint} did not answer: {exc!r}", file=sys.stderr)
                return 1
        finally:
            if stores is not None:
                await stores.close()
            await redis.aclose()
            await etcd.close()
        if args.json:
            print(orjson.dumps(state.to_json(), option=orjson.OPT_INDENT_2).decode())
        else:
            print(state.table())
        return 0

    return asyncio.run(show())
