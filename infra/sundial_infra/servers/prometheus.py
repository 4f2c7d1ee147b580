"""Prometheus: Debian's ``prometheus`` scraping the Sundial processes it finds in file-based service discovery.

This module owns the local Prometheus (same start/stop contract as the other servers, data under its
``data_dir``, loopback only), its generated configuration (``<data_dir>/prometheus.yml``: the scrape
interval, the rule files of ``infra/prometheus/rules/`` and one ``file_sd_configs`` job reading
``<data_dir>/targets/*.json``), and :func:`write_targets`, how a supervisor or a test announces the
processes to scrape. Prometheus re-reads the target files when they change, so adding a replica needs
no configuration edit and no restart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from sundial_infra.servers.base import Server

#: The alerting and recording rules every Prometheus of Sundial loads (the compose one too).
RULES_DIR = Path(__file__).resolve().parents[2] / "prometheus" / "rules"


@dataclasses.dataclass(frozen=True)
class ScrapeTarget:
    """One process to scrape: its ``/metrics`` address and the labels its series get."""

    service: str  # api, dispatcher, hydrator, sweeper, worker
    instance: str  # the replica's name (its SUNDIAL_INSTANCE_ID), not host:port
    address: str  # host:port of its /metrics


def write_targets(path: Path, targets: Iterable[ScrapeTarget]) -> None:
    """Write a file-SD target file atomically (Prometheus may read it at any moment)."""
    groups = [
        {"targets": [t.address], "labels": {"service": t.service, "instance": t.instance}}
        for t in sorted(targets, key=lambda t: t.instance)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    os.replace(tmp, path)


class PrometheusServer(Server):
    """``prometheus`` on ``127.0.0.1:port`` with its TSDB, config and target files under ``data_dir``."""

    name = "prometheus"

    def __init__(
        self,
        data_dir: Path,
        port: int,
        *,
        # Prometheus' usual 15 s: every rule looks at 5 minutes and the dashboards use $__rate_interval. At 5 s,
        # scraping the 11 processes of `make up` cost ~0.01 of a core, Prometheus and the renders together.
        scrape_interval: str = "15s",
        evaluation_interval: str | None = None,
        rules_dir: Path = RULES_DIR,
        start_timeout: float = 60.0,
    ) -> None:
        super().__init__(data_dir, port, start_timeout=start_timeout)
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval or scrape_interval
        self.rules_dir = rules_dir

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def targets_dir(self) -> Path:
        return self.data_dir / "targets"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "prometheus.yml"

    def config(self) -> str:
        """The configuration: JSON is YAML, so it is written without a YAML library."""
        return json.dumps(
            {
                "global": {
                    "scrape_interval": self.scrape_interval,
                    "evaluation_interval": self.evaluation_interval,
                    "external_labels": {"stack": "local"},
                },
                "rule_files": [str(self.rules_dir / "*.yml")],
                "scrape_configs": [
                    {
                        "job_name": "sundial",
                        "file_sd_configs": [{"files": [str(self.targets_dir / "*.json")], "refresh_interval": "5s"}],
                    }
                ],
            },
            indent=2,
        )

    def _prepare(self) -> None:
        super()._prepare()
        self.targets_dir.mkdir(exist_ok=True)
        self.config_file.write_text(self.config() + "\n")

    def _command(self) -> list[str]:
        return [
            shutil.which("prometheus") or "/usr/bin/prometheus",
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=7d",
            # POST /-/reload after a rule edit; the target files need none.
            "--web.enable-lifecycle",
        ]

    def _probe(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False
