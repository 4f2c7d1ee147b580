"""`make run`'s banner names every URL a developer opens, each on the port its process listens on."""

from __future__ import annotations

from pathlib import Path

from sundial_infra.dev_runner import DevLayout, banner
from sundial_infra.stack import DEV_PORTS, LocalStack
from sundial_infra.supervisor import default_processes


def test_the_banner_names_the_gateway_where_the_stack_starts_it(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path, DEV_PORTS, prometheus=True)
    api = DEV_PORTS.api
    text = banner(DevLayout(tmp_path), stack)
    [gateway] = [spec for spec in default_processes(api_port=api) if spec.name == "gateway"]
    assert gateway.argv[-2:] == ("--port", str(api + 1))
    lines: dict[str, str] = {}  # the first word of each indented line -> the word after it
    for line in text.splitlines():
        words = line.split()
        if line.startswith("  ") and len(words) > 1:
            lines.setdefault(words[0], words[1])
    assert lines["Gateway"] == f"http://127.0.0.1:{api + 1}"
    assert lines["API"] == f"http://127.0.0.1:{api}"
    assert lines["Console"] == f"http://127.0.0.1:{api}/ui"
    assert lines["Prometheus"].startswith("http://127.0.0.1:")
