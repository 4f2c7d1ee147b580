"""The local stack: Postgres, Redis, etcd and the broker (and Prometheus) composed on one port set under one root.

This module owns the port sets — ``DEV_PORTS`` for ``make up``/``make run`` (state under ``.sundial/``),
``TEST_PORTS`` for the test suite (``.sundial/test/``) and ``BENCH_PORTS`` for the bench — and
``LocalStack``, which starts and stops the four servers together, plus Prometheus when asked (``make up``
does; the test suite starts it only for the tests that need it, through a fixture of their own).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from sundial_infra.process import ServerError
from sundial_infra.servers.base import Server
from sundial_infra.servers.broker import BrokerServer
from sundial_infra.servers.etcd import EtcdServer
from sundial_infra.servers.postgres import PostgresServer
from sundial_infra.servers.prometheus import PrometheusServer
from sundial_infra.servers.redis import RedisServer


@dataclasses.dataclass(frozen=True)
class Ports:
    """Loopback ports of one stack. etcd also uses ``etcd + 1`` for its peer listener."""

    postgres: int
    redis: int
    etcd: int
    broker: int
    api: int
    prometheus: int


# All three sets sit below Linux's ephemeral range (32768-60999): there any client socket of any process
# may hold a port, and a CI run once failed on a broker port taken that way. Each service's number ends
# like its well-known port (…432, …379, …092, …090) without being it (nor 2380, 8080, 9090, Sentinel's 26379 or
# the 29092 of Kafka's docker images). TEST and BENCH are moved by +100·k (k ≤ 15: SUNDIAL_TEST_PORT_OFFSET,
# pytest-xdist workers, `bench --port-offset`) and the sets stay pairwise disjoint over every such offset,
# etcd's peer port (+1) included; tests/unit/test_ports.py checks it.
DEV_PORTS = Ports(postgres=15432, redis=16379, etcd=12379, broker=19092, api=8080, prometheus=19090)
TEST_PORTS = Ports(postgres=25432, redis=24379, etcd=22379, broker=27092, api=28080, prometheus=29090)
BENCH_PORTS = Ports(postgres=30432, redis=30379, etcd=20379, broker=31092, api=18080, prometheus=21090)
#: ``/metrics`` ports of the dev stack's replicas (dispatcher-1 … worker), one each, given by the supervisor;
#: the API serves its metrics on its own port. They end in 00-15, which no port of any set above ends in.
DEV_METRICS_PORTS = range(19100, 19116)
#: The largest offset a TEST or BENCH set may be moved by and stay disjoint from the others.
MAX_PORT_OFFSET = 1500


class LocalStack:
    """Postgres, Redis, etcd and the broker (and Prometheus if ``prometheus``) under ``root/<server>/``."""

    def __init__(
        self,
        root: Path,
        ports: Ports = DEV_PORTS,
        durable: bool = True,
        postgres_settings: dict[str, str] | None = None,
        *,
        prometheus: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        self.ports = ports
        self.durable = durable
        self.postgres = PostgresServer(
            self.root / "postgres", ports.postgres, durable=durable, settings=postgres_settings
        )
        self.redis = RedisServer(self.root / "redis", ports.redis)
        self.etcd = EtcdServer(self.root / "etcd", ports.etcd)
        self.broker = BrokerServer(self.root / "broker", ports.broker)
        self.prometheus = PrometheusServer(self.root / "prometheus", ports.prometheus) if prometheus else None

    @property
    def servers(self) -> tuple[Server, ...]:
        core: tuple[Server, ...] = (self.postgres, self.redis, self.etcd, self.broker)
        return core if self.prometheus is None else (*core, self.prometheus)

    @property
    def postgres_dsn(self) -> str:
        return self.postgres.dsn

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def etcd_endpoint(self) -> str:
        return self.etcd.endpoint

    @property
    def kafka_bootstrap(self) -> str:
        return self.broker.bootstrap

    def env(self) -> dict[str, str]:
        """SUNDIAL_* variables that point every Sundial process at this stack.

        A local stack is a development stack (``make up``, the bench, the tests), so its processes may use the
        development signing key: ``SUNDIAL_ENV=dev`` (a real deployment configures a key and no such flag).
        """
        return {
            "SUNDIAL_ENV": "dev",
            "SUNDIAL_DATABASE_URL": self.postgres_dsn,
            "SUNDIAL_REDIS_URL": self.redis_url,
            "SUNDIAL_ETCD_ENDPOINT": self.etcd_endpoint,
            "SUNDIAL_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            # ... and share a generated master key under its root.
            "SUNDIAL_DEV_ROOT": str(self.root),
        }

    def start(self) -> None:
        """Start the servers concurrently; if one fails, stop the others and raise."""
        errors = _each(self.servers, lambda s: s.start())
        if errors:
            with contextlib.suppress(ServerError):  # the start-up failure is the one worth reporting
                self.stop()
            raise ServerError("local stack failed to start:\n" + "\n".join(errors))

    def stop(self) -> None:
        """Stop every server that runs from this root, whoever started it; idempotent."""
        errors = _each(self.servers, lambda s: s.stop())
        if errors:
            raise ServerError("local stack failed to stop cleanly:\n" + "\n".join(errors))

    def status(self) -> Iterator[tuple[Server, int | None]]:
        for server in self.servers:
            yield server, server.pid


def _each(servers: Sequence[Server], action: Callable[[Server], None]) -> list[str]:
    """Run ``action`` on every server in its own thread (start-up is I/O-bound); return the failures."""
    with concurrent.futures.ThreadPoolExecutor(len(servers), thread_name_prefix="stack") as pool:
        futures: Mapping[concurrent.futures.Future[None], Server] = {
            pool.submit(action, server): server for server in servers
        }
        errors = []
        for future in concurrent.futures.as_completed(futures):
            if (exc := future.exception()) is not None:
                errors.append(f"{futures[future].name}: {exc}")
        return errors
