"""The e2e fixtures: real Sundial processes (`processes`, stopped after the test), Prometheus, an OTLP receiver."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sundial_infra.servers.prometheus import PrometheusServer
from sundial_infra.stack import LocalStack

from tests.support.otlp import OtlpReceiver
from tests.support.processes import Processes


@pytest.fixture
def processes(settings_env: dict[str, str], tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(settings_env, tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
def prometheus(stack: LocalStack) -> Iterator[PrometheusServer]:
    """The real Prometheus on the test stack's port, scraping every second, from an empty TSDB.

    Only the tests that ask for it start it: it is not part of every session's stack.
    """
    server = PrometheusServer(stack.root / "prometheus", stack.ports.prometheus, scrape_interval="1s")
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)  # no series of an earlier session
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    """A real OTLP/HTTP receiver (:mod:`tests.support.otlp`); pass ``otlp_env(otlp)`` to the processes that export."""
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()
