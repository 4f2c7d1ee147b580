"""The port sets stay out of the ephemeral range, off well-known services, and apart under every offset."""

from __future__ import annotations

import dataclasses

from sundial_infra.stack import BENCH_PORTS, DEV_METRICS_PORTS, DEV_PORTS, MAX_PORT_OFFSET, TEST_PORTS, Ports

# Linux's default net.ipv4.ip_local_port_range: a client socket of any process may hold one of these.
EPHEMERAL = range(32768, 61000)
# Services a developer machine may run: Postgres, Redis and Sentinel, etcd, Kafka (and its docker images'
# second listener), Prometheus, Jaeger, OTLP, Grafana, RabbitMQ, ZooKeeper, memcached, MongoDB, Elasticsearch.
WELL_KNOWN = {5432, 6379, 26379, 2379, 2380, 9092, 29092, 9090, 9093, 16686, 14268, 4317, 4318, 3000, 5672}
WELL_KNOWN |= {15672, 2181, 11211, 27017, 9200, 9300, 8000, 8081}
OFFSETS = range(0, MAX_PORT_OFFSET + 1, 100)


def _listening(ports: Ports) -> list[int]:
    """Every port a stack on ``ports`` listens on (etcd's peers on etcd + 1)."""
    return [*(getattr(ports, f.name) for f in dataclasses.fields(Ports)), ports.etcd + 1]


def _moved(ports: Ports, offset: int) -> Ports:
    return Ports(**{f.name: getattr(ports, f.name) + offset for f in dataclasses.fields(Ports)})


def test_every_port_of_every_set_and_offset_is_below_the_ephemeral_range_and_off_well_known_services() -> None:
    used = _listening(DEV_PORTS) + [
        p for o in OFFSETS for s in (TEST_PORTS, BENCH_PORTS) for p in _listening(_moved(s, o))
    ]
    assert all(1024 < port < EPHEMERAL.start for port in used), sorted(p for p in used if p >= EPHEMERAL.start)
    # The dev API keeps 8080, which the documentation's examples use.
    assert DEV_PORTS.api == 8080
    assert not set(used) & WELL_KNOWN, set(used) & WELL_KNOWN


def test_dev_test_and_bench_ports_never_meet_under_any_offset() -> None:
    owner: dict[int, str] = {}
    sets = [("dev", DEV_PORTS, range(1))] + [(n, s, OFFSETS) for n, s in (("test", TEST_PORTS), ("bench", BENCH_PORTS))]
    for name, ports, offsets in sets:
        for offset in offsets:
            for port in _listening(_moved(ports, offset)):
                assert port not in owner, f"{name}+{offset} port {port} is also {owner[port]}'s"
                owner[port] = f"{name}+{offset}"


def test_the_dev_replicas_metrics_ports_are_apart_from_every_set() -> None:
    used = _listening(DEV_PORTS) + [
        p for o in OFFSETS for s in (TEST_PORTS, BENCH_PORTS) for p in _listening(_moved(s, o))
    ]
    metrics = set(DEV_METRICS_PORTS)
    assert all(1024 < port < EPHEMERAL.start for port in metrics)
    assert not metrics & set(used), sorted(metrics & set(used))
    assert not metrics & WELL_KNOWN
