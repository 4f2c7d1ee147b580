"""Session fixtures every test layer shares: the real servers, and a clean slice of each per test.

``stack`` starts Postgres, Redis, etcd and the broker once per session on ``TEST_PORTS`` (never the ports
``make up`` uses) under ``.sundial/test/``, wiped first, and stops them at the end. Function fixtures hand
each test a clean slice: ``database_url`` a fresh database cloned from a migrated template (cloning is
milliseconds, migrating is not), ``redis_url`` a flushed Redis, ``etcd_endpoint`` an etcd without
``/sundial/`` keys. Nothing is autouse, so a run of ``tests/unit`` alone starts no server.

The test ports are a machine-wide resource: a session holds an exclusive lock on them for its whole
life, so a second concurrent session (another worktree, another engineer) waits instead of wiping the
first one's servers. ``SUNDIAL_TEST_PORT_OFFSET=N`` moves a session to ports ``TEST_PORTS + N`` (and
``.sundial/test-N/``) to run alongside.

``make test`` (``tests/lanes.sh``) runs two sessions at once, one per core, each with its stack: the
in-process layers (unit, integration) at N and the layers that run Sundial's processes (e2e, faults, one
test at a time) at N + 100, so two process stacks never compete for this machine's two cores, which is what
their latency and heartbeat windows assume. Under pytest-xdist (``pytest -n K``) each worker is a session at
``N + 100 × worker index``: give parallel sessions bases far enough apart.
"""

from __future__ import annotations

import os

# The etcd client's gRPC threads live in this process while it forks servers (Postgres via runuser): with
# gRPC's fork handlers on, a forked child was once seen to crash before exec. We never use gRPC in a child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# The master key every Sundial process of the tests seals tenants' data with (in this process, and inherited by
# the processes the e2e and fault tests start); a test of another key (rotation, a wrong key) passes its own.
os.environ.setdefault("SUNDIAL_MASTER_KEY", "c3VuZGlhbC10ZXN0LW1hc3Rlci1rZXktMzItYnl0ZXM=")
# The suite signs its tokens with the public development key (or keys of its own): allowed only in dev. Set here,
# not with setdefault, so a shell exporting SUNDIAL_ENV=production cannot make every process refuse to start.
os.environ["SUNDIAL_ENV"] = "dev"

import atexit
import contextlib
import fcntl
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import FrameType

import aetcd
import asyncpg
import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher
from sundial_common.stores import Stores
from sundial_infra.servers.base import Server
from sundial_infra.stack import LocalStack, Ports

from tests.support.ports import port_offset, session_ports

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DB = "sundial_template"
ETCD_PREFIX = b"/sundial/"
# Under pytest-timeout's default (300 s) so that a session waiting for the ports fails with our message.
PORT_LOCK_WAIT_SEC = 240.0


@contextlib.contextmanager
def _exclusive(ports: Ports) -> Iterator[None]:
    """Hold the machine-wide lock on this port set (released by the OS if the session dies)."""
    path = Path(tempfile.gettempdir()) / f"sundial-test-ports-{ports.postgres}.lock"
    with open(path, "a+") as lock:
        deadline = time.monotonic() + PORT_LOCK_WAIT_SEC
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    lock.seek(0)
                    pytest.fail(
                        f"another test session ({lock.read().strip() or 'unknown'}) holds the test ports "
                        f"(lock {path}) for more than {PORT_LOCK_WAIT_SEC:.0f}s; wait for it, or run this "
                        f"one beside it with SUNDIAL_TEST_PORT_OFFSET={port_offset() + 1000}"
                    )
                time.sleep(0.5)  # polling another session's lock; there is no event to wait on
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} in {REPO_ROOT}\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def stack() -> Iterator[LocalStack]:
    """Postgres (non-durable), Redis, etcd and the broker, started once per session on the test ports."""
    ports, root = session_ports()
    with _exclusive(ports):
        local = LocalStack(root, ports, durable=False)
        local.stop()  # servers a killed session left behind (their pid files are under root)
        shutil.rmtree(root, ignore_errors=True)
        # pytest tears session fixtures down on Ctrl-C; SIGTERM (a cancelled CI job, `timeout`) is made
        # to behave the same. atexit covers an interrupt that lands while start() runs.
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        atexit.register(local.stop)
        try:
            local.start()
            yield local
        finally:
            local.stop()
            atexit.unregister(local.stop)
            if previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, previous)


def _raise_keyboard_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def ensure_running(server: Server) -> None:
    """A fault test may leave a server stopped; the next test still gets a working one."""
    if not server.is_running():
        server.start()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def template_db(stack: LocalStack) -> str:
    """DSN of ``sundial_template``: an empty database brought to the newest schema by the real migrations.

    It accepts no connections afterwards, because ``CREATE DATABASE … TEMPLATE`` fails while the
    template has any session.
    """
    from sundial_common.stores.schema import upgrade  # imported late: unit-only runs must not need it

    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {TEMPLATE_DB}")
        dsn = stack.postgres.dsn_for(TEMPLATE_DB)
        await upgrade(dsn)
        await admin.execute(f"ALTER DATABASE {TEMPLATE_DB} WITH ALLOW_CONNECTIONS false")
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", TEMPLATE_DB)
    finally:
        await admin.close()
    return dsn


@pytest_asyncio.fixture(loop_scope="session")
async def blank_database(stack: LocalStack) -> AsyncIterator[str]:
    """A database of its own with no schema at all (not a clone of the template): for tests of migrations."""
    name = f"blank_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    yield stack.postgres.dsn_for(name)
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest_asyncio.fixture(loop_scope="session")
async def database_url(stack: LocalStack, template_db: str) -> AsyncIterator[str]:
    """DSN of a fresh, migrated database ``t_<8 hex>`` of this test's own (dropped afterwards)."""
    ensure_running(stack.postgres)
    name = f"t_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(stack.postgres_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
    finally:
        await admin.close()
    yield stack.postgres.dsn_for(name)
    # Best effort: a test that stopped Postgres for good must not turn its own failure into this one.
    with contextlib.suppress(Exception):
        admin = await asyncpg.connect(stack.postgres_dsn, timeout=5)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


@pytest_asyncio.fixture(loop_scope="session")
async def redis_url(stack: LocalStack) -> AsyncIterator[str]:
    """URL of the test Redis, emptied (FLUSHALL) for this test."""
    ensure_running(stack.redis)
    client = Redis.from_url(stack.redis_url)
    try:
        await client.flushall()
    finally:
        await client.aclose()
    yield stack.redis_url


@pytest_asyncio.fixture(loop_scope="session")
async def etcd_endpoint(stack: LocalStack) -> AsyncIterator[str]:
    """``host:port`` of the test etcd, without any key under ``/sundial/``."""
    ensure_running(stack.etcd)
    host, port = stack.etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        await client.delete_prefix(ETCD_PREFIX)
    yield stack.etcd_endpoint


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: LocalStack) -> str:
    """Bootstrap servers of the test broker. Topics live for the session: use names of your own."""
    return stack.kafka_bootstrap


@pytest.fixture
def settings_env(database_url: str, redis_url: str, etcd_endpoint: str, kafka_bootstrap: str) -> dict[str, str]:
    """SUNDIAL_* variables pointing a Sundial process (or ``CommonSettings``) at this test's slices."""
    return {
        "SUNDIAL_DATABASE_URL": database_url,
        "SUNDIAL_REDIS_URL": redis_url,
        "SUNDIAL_ETCD_ENDPOINT": etcd_endpoint,
        "SUNDIAL_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "SUNDIAL_ENV": "dev",
    }


@pytest.fixture(scope="session")
def _span_exporter() -> InMemorySpanExporter:
    """One in-memory exporter on the process-wide tracer provider (which can be set only once)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(_span_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """The spans finished during this test (the SDK's in-memory exporter, as the OTLP one would see them)."""
    _span_exporter.clear()
    yield _span_exporter
    _span_exporter.clear()


@pytest_asyncio.fixture(loop_scope="session")
async def stores(database_url: str) -> AsyncIterator[Stores]:
    """The stores, over one asyncpg pool, on this test's fresh database."""
    s = await Stores.connect(database_url)
    yield s
    await s.close()


@pytest.fixture
async def publisher(kafka_bootstrap: str) -> AsyncIterator[KafkaPublisher]:
    """The dispatcher's Kafka publisher on the test broker."""
    p = KafkaPublisher(kafka_bootstrap)
    yield p
    await p.close()
