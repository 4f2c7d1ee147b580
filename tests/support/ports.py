"""This test session's ports: ``TEST_PORTS`` moved by ``SUNDIAL_TEST_PORT_OFFSET`` (and by the xdist worker), so
sessions of several worktrees or workers run side by side."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from sundial_infra.stack import TEST_PORTS, Ports

REPO_ROOT = Path(__file__).resolve().parents[2]


#: Port distance between the stacks of two xdist workers of one session.
XDIST_WORKER_PORT_STRIDE = 100


def port_offset() -> int:
    """This session's (this xdist worker's) offset from ``TEST_PORTS``."""
    base = int(os.environ.get("SUNDIAL_TEST_PORT_OFFSET", "0") or "0")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", … under xdist; unset otherwise
    index = int(worker[2:]) if worker.startswith("gw") else 0
    return base + XDIST_WORKER_PORT_STRIDE * index


def session_ports() -> tuple[Ports, Path]:
    """This session's ports and the folder its servers keep their data in."""
    offset = port_offset()
    ports = Ports(**{f.name: getattr(TEST_PORTS, f.name) + offset for f in dataclasses.fields(Ports)})
    root = REPO_ROOT / ".sundial" / ("test" if offset == 0 else f"test-{offset}")
    return ports, root
