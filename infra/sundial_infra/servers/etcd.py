"""etcd: a single-member cluster for the dispatchers' shard leases."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request

from sundial_infra.servers.base import Server


class EtcdServer(Server):
    """A single-member etcd cluster (``default``); clients on ``port``, peers on ``port + 1``."""

    name = "etcd"

    @property
    def url(self) -> str:
        return self.endpoint

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def peer_port(self) -> int:
        return self.port + 1

    def _ports(self) -> tuple[int, ...]:
        return (self.port, self.peer_port)

    def _prepare(self) -> None:
        super()._prepare()
        self.data_dir.chmod(0o700)  # etcd warns about (and 3.5 refuses) a group-readable data dir

    def _command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            shutil.which("etcd") or "/usr/bin/etcd",
            "--name",
            "default",
            "--data-dir",
            str(self.data_dir / "data"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"default={peer}",
            "--initial-cluster-state",
            "new",
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]

    def _probe(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1.0) as resp:
                return resp.status == 200 and b'"true"' in resp.read()
        except (OSError, urllib.error.URLError):
            return False
