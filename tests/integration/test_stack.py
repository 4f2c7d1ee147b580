"""The local stack and the shared fixtures work on the real servers, and the supervisor keeps processes up.

If these fail, every other integration test fails for the same reason; they are the first place to look.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path

import aetcd
import asyncpg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from redis.asyncio import Redis
from sundial_common.runtime.settings import CommonSettings
from sundial_infra.process import pid_alive, read_pid_file, wait_for
from sundial_infra.stack import LocalStack
from sundial_infra.supervisor import Backoff, ProcessSpec, Supervisor


async def test_postgres_serves_the_sundial_superuser_on_loopback_without_fsync(stack: LocalStack) -> None:
    conn = await asyncpg.connect(stack.postgres_dsn)
    try:
        row = await conn.fetchrow(
            "SELECT current_user AS u, current_database() AS db,"
            " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS su"
        )
        assert row is not None
        assert (row["u"], row["db"], row["su"]) == ("sundial", "sundial", True)
        assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
        assert await conn.fetchval("SHOW fsync") == "off"  # tests run a non-durable cluster for speed
    finally:
        await conn.close()


async def test_each_test_gets_its_own_migrated_database(stack: LocalStack, database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert (await conn.fetchval("SELECT current_database()")).startswith("t_")
        tables = await conn.fetchval("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
        assert tables > 0, "the template was not migrated"
        await conn.execute("CREATE TABLE only_in_this_test (x int)")
    finally:
        await conn.close()

    # A sibling clone of the template does not see what this test wrote.
    sibling = f"t_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {sibling} TEMPLATE sundial_template")
        other = await asyncpg.connect(stack.postgres.dsn_for(sibling))
        try:
            assert await other.fetchval("SELECT to_regclass('only_in_this_test')") is None
        finally:
            await other.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {sibling} WITH (FORCE)")
        await admin.close()


async def test_postgres_keeps_committed_rows_across_an_immediate_stop(stack: LocalStack) -> None:
    conn = await asyncpg.connect(stack.postgres_dsn)
    await conn.execute("CREATE TABLE IF NOT EXISTS stack_probe (v text)")
    marker = uuid.uuid4().hex
    await conn.execute("INSERT INTO stack_probe VALUES ($1)", marker)
    await conn.close()

    stack.postgres.restart(mode="immediate")  # what fault tests do: no checkpoint, crash recovery

    conn = await asyncpg.connect(stack.postgres_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM stack_probe WHERE v = $1", marker) == 1
    finally:
        await conn.close()


async def test_redis_url_is_empty_and_a_restart_empties_redis(stack: LocalStack, redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        assert await client.dbsize() == 0
        await client.set("sundial:probe", "1")
        assert await client.get("sundial:probe") == b"1"
    finally:
        await client.aclose()

    stack.redis.restart()  # Redis may lose everything at any moment (DESIGN invariant 1)

    client = Redis.from_url(redis_url)
    try:
        assert await client.ping()
        assert await client.get("sundial:probe") is None
    finally:
        await client.aclose()


async def test_etcd_endpoint_starts_without_sundial_keys(etcd_endpoint: str) -> None:
    host, port = etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        assert (await client.get_prefix(b"/sundial/")).count == 0
        await client.put(b"/sundial/probe", b"v")
        got = await client.get(b"/sundial/probe")
        assert got is not None and got.value == b"v"


def test_broker_round_trips_a_message_through_a_consumer_group(kafka_bootstrap: str) -> None:
    topic = f"stack-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"k", value=b"hello", headers=[("attempt", b"1")])
    assert producer.flush(10) == 0, "message not delivered"

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            # Tansu's first group join takes about half of session.timeout.ms; keep it short.
            "session.timeout.ms": 6000,
        }
    )
    try:
        consumer.subscribe([topic])
        received = None
        deadline = time.monotonic() + 30
        while received is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                received = msg
        assert received is not None, "no message within 30s"
        assert (received.key(), received.value()) == (b"k", b"hello")
        assert dict(received.headers() or []) == {"attempt": b"1"}
    finally:
        consumer.close()


def test_a_broker_restart_forgets_every_topic(stack: LocalStack) -> None:
    topic = f"stack-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap})
    producer.produce(topic, value=b"x")
    assert producer.flush(10) == 0
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    assert topic in admin.list_topics(timeout=10).topics

    stack.broker.restart()  # memory storage: Kafka may lose everything too (DESIGN invariant 1)

    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    assert topic not in admin.list_topics(timeout=10).topics


def test_settings_env_configures_common_settings(
    settings_env: dict[str, str], stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in settings_env.items():
        monkeypatch.setenv(key, value)
    settings = CommonSettings()
    assert settings.database_url.startswith(f"postgresql://sundial@127.0.0.1:{stack.ports.postgres}/t_")
    assert settings.redis_url == stack.redis_url
    assert settings.etcd_endpoint == stack.etcd_endpoint
    assert settings.kafka_bootstrap == stack.kafka_bootstrap


def test_a_second_stack_object_finds_and_reports_the_running_servers(stack: LocalStack) -> None:
    # What `sundial dev down` relies on: another process sees the servers through their pid files.
    other = LocalStack(stack.root, stack.ports, durable=False)
    assert {server.name: pid for server, pid in other.status()} == {server.name: server.pid for server in stack.servers}
    assert all(server.pid is not None for server in stack.servers)


def test_supervisor_restarts_a_crashing_process_with_growing_backoff_and_stops_everything(
    tmp_path: Path,
) -> None:
    py = sys.executable
    marker = tmp_path / "crashes"
    crash = f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(3)"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    supervisor = Supervisor(
        [
            ProcessSpec("crasher", (py, "-c", crash)),
            ProcessSpec("stubborn", (py, "-c", stubborn)),
            ProcessSpec("forks", ("bash", "-c", "sleep 600 & wait")),
        ],
        env={"SUNDIAL_PROBE": "1"},
        log_dir=tmp_path / "logs",
        run_dir=tmp_path / "run",
        backoff=Backoff(initial=0.1, factor=2.0, maximum=1.0),
        stop_timeout=1.0,
    )
    stop = threading.Event()
    loop = threading.Thread(target=supervisor.run, args=(stop,), name="supervise")
    loop.start()
    try:
        supervisor.start()
        assert wait_for(lambda: marker.exists() and len(marker.read_text()) >= 4, 15.0), "not restarted"
        crasher_log = (tmp_path / "logs" / "crasher.log").read_text()
        assert "exited with code 3" in crasher_log
        delays = [line.rsplit("restarting in ", 1)[1] for line in crasher_log.splitlines() if "restarting in" in line]
        assert delays[:3] == ["0.1s", "0.2s", "0.4s"]  # a crash loop slows down
        pids = {name: read_pid_file(tmp_path / "run" / f"{name}.pid") for name in ("stubborn", "forks")}
        assert all(pid is not None for pid in pids.values())
        forks_pid = pids["forks"]
        assert forks_pid is not None
        assert wait_for(lambda: len(_group_members(forks_pid)) == 2, 5.0)  # bash and its `sleep`
    finally:
        stop.set()
        loop.join()
        supervisor.stop()

    # Gone: the one ignoring SIGTERM (killed after stop_timeout) and the grandchild `sleep` of `forks`.
    assert all(pid is not None and not pid_alive(pid) for pid in pids.values())
    assert wait_for(lambda: _group_members(forks_pid) == [], 5.0), "a grandchild outlived stop()"
    assert not list((tmp_path / "run").glob("*.pid"))
    supervisor.stop()  # idempotent


def _group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (from /proc: field 5 of stat is the group)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members
