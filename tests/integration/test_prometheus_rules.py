"""The alerting and recording rules pass the real promtool: syntax, and a unit test for every alert."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from sundial_infra.servers.prometheus import PrometheusServer

PROMETHEUS = Path(__file__).resolve().parents[2] / "infra" / "prometheus"


def _promtool(*args: str) -> str:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: `make deps` installs Debian's prometheus package"
    result = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=PROMETHEUS, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_rules_are_valid() -> None:
    out = _promtool("check", "rules", *(str(p) for p in sorted((PROMETHEUS / "rules").glob("*.yml"))))
    assert "SUCCESS" in out


def test_every_alert_has_a_promtool_unit_test_and_they_pass() -> None:
    tests = sorted((PROMETHEUS / "tests").glob("*.yml"))
    _promtool("test", "rules", *(str(p) for p in tests))
    alerts = {m for p in (PROMETHEUS / "rules").glob("*.yml") for m in re.findall(r"- alert: (\w+)", p.read_text())}
    tested = {m for p in tests for m in re.findall(r"alertname: (\w+)", p.read_text())}
    assert alerts, "no alerts found"
    assert alerts <= tested, f"alerts without a promtool test: {sorted(alerts - tested)}"


def test_the_local_and_the_compose_prometheus_configs_are_valid(tmp_path: Path) -> None:
    local = PrometheusServer(tmp_path / "prometheus", 29090)
    local.data_dir.mkdir()
    local.config_file.write_text(local.config())
    out = _promtool("check", "config", str(local.config_file))
    assert "SUCCESS" in out and "rules found" in out  # the rules of infra/prometheus/rules are loaded
    _promtool("check", "config", str(PROMETHEUS.parent / "compose" / "prometheus.yml"))
