"""Every background process answers real probes on its metrics port: ready only while its loops' passes
succeed, alive while its event loop turns, and 404 on any other path (a misdirected probe fails)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.processes import Processes, free_port


def wait_for(url: str, status: int, timeout: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    answer: httpx.Response | None = None
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, timeout=2)
            if answer.status_code == status:
                return answer
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered {status}; last: {answer and (answer.status_code, answer.text)}")


@pytest.mark.e2e
def test_a_process_whose_dependency_is_down_is_alive_but_not_ready(processes: Processes) -> None:
    port = free_port()
    dead = free_port()  # nothing listens there: every hydrate pass fails to reach Redis
    processes.start(
        "hydrator",
        "hydrator",
        "--interval",
        "0.2",
        env={"SUNDIAL_METRICS_PORT": str(port), "SUNDIAL_REDIS_URL": f"redis://127.0.0.1:{dead}/0"},
    )
    not_ready = wait_for(f"http://127.0.0.1:{port}/readyz", 503, timeout=60)
    assert "hydrate: last pass failed" in not_ready.text, processes.log("hydrator")[-2000:]
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).text == "ok\n"
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 404


@pytest.mark.e2e
def test_a_process_with_its_dependencies_up_is_ready(processes: Processes) -> None:
    port = free_port()
    processes.start("sweeper", "sweeper", "--interval", "0.2", env={"SUNDIAL_METRICS_PORT": str(port)})
    assert wait_for(f"http://127.0.0.1:{port}/readyz", 200, timeout=60).text == "ok\n"
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).text == "ok\n"
