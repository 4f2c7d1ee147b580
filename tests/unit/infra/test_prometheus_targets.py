"""`make up`'s scrape targets come from the supervisor's process table; the Prometheus config reads them."""

from __future__ import annotations

import json
from pathlib import Path

from sundial_infra.servers.prometheus import RULES_DIR, PrometheusServer, ScrapeTarget, write_targets
from sundial_infra.stack import DEV_METRICS_PORTS, DEV_PORTS
from sundial_infra.supervisor import ProcessSpec, Supervisor, default_processes


def test_every_dev_process_is_scraped_on_a_port_of_its_own_named_by_service_and_instance() -> None:
    processes = default_processes()
    targets = [p.scrape for p in processes]
    assert all(t is not None for t in targets)
    addresses = [t.address for t in targets if t is not None]
    assert len(set(addresses)) == len(addresses)
    assert {t.service for t in targets if t is not None} == {
        "api",
        "services",
        "dispatcher",
        "worker",
        "gateway",
        "analytics",
    }
    assert f"127.0.0.1:{DEV_PORTS.api}" in addresses
    for spec in processes:
        env = dict(spec.env)
        assert env["SUNDIAL_INSTANCE_ID"] == spec.name
        assert spec.scrape is not None and spec.scrape.instance == spec.name
        if spec.name != "api":  # the API serves /metrics on its own port
            assert int(env["SUNDIAL_METRICS_PORT"]) in DEV_METRICS_PORTS
            assert spec.scrape.address == f"127.0.0.1:{env['SUNDIAL_METRICS_PORT']}"


def test_the_supervisor_writes_file_sd_targets_from_its_process_table(tmp_path: Path) -> None:
    processes = [
        ProcessSpec(f"replica-{i}", ("sleep", "30"), scrape=ScrapeTarget("worker", f"replica-{i}", f"127.0.0.1:{i}"))
        for i in (1, 2)
    ]
    targets = tmp_path / "prometheus" / "targets" / "sundial.json"
    supervisor = Supervisor(
        processes, env={}, log_dir=tmp_path / "logs", run_dir=tmp_path / "run", targets_file=targets
    )
    supervisor.start()
    try:
        groups = json.loads(targets.read_text())
    finally:
        supervisor.stop()
    assert groups == [
        {"targets": [f"127.0.0.1:{i}"], "labels": {"service": "worker", "instance": f"replica-{i}"}} for i in (1, 2)
    ]


def test_the_generated_config_scrapes_the_target_files_and_loads_the_rules(tmp_path: Path) -> None:
    server = PrometheusServer(tmp_path / "prometheus", 29090, scrape_interval="1s")
    config = json.loads(server.config())
    assert config["global"]["scrape_interval"] == "1s"
    assert config["rule_files"] == [str(RULES_DIR / "*.yml")] and any(RULES_DIR.glob("*.yml"))
    [job] = config["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == [str(server.targets_dir / "*.json")]
    write_targets(server.targets_dir / "x.json", [ScrapeTarget("worker", "w-1", "127.0.0.1:1")])
    assert not list(server.targets_dir.glob(".*.tmp"))
