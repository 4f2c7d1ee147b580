"""Every command's ``--help`` names every ``SUNDIAL_*`` variable it reads, generated from its settings class."""

from __future__ import annotations

import pytest
from pydantic_settings import BaseSettings
from sundial_analytics.settings import AnalyticsSettings
from sundial_api.settings import ApiSettings
from sundial_client.command import main as sundial
from sundial_common.runtime.settings import CommonSettings, env_var
from sundial_dispatcher.cluster_cli import CLUSTER_FIELDS
from sundial_dispatcher.settings import DispatcherSettings
from sundial_hydrator.settings import HydratorSettings
from sundial_replayer.settings import ReplayerSettings
from sundial_sweeper.settings import SweeperSettings
from sundial_worker.settings import WorkerSettings

COMMANDS: list[tuple[str, type[BaseSettings], tuple[str, ...] | None]] = [
    ("api", ApiSettings, None),
    ("dispatcher", DispatcherSettings, None),
    ("hydrator", HydratorSettings, None),
    ("sweeper", SweeperSettings, None),
    ("replayer", ReplayerSettings, None),
    ("worker", WorkerSettings, None),
    ("analytics", AnalyticsSettings, None),
    ("migrate", CommonSettings, ("database_url",)),
    ("token", CommonSettings, ("env", "jwt_secret", "jwt_keys", "jwt_audience")),
    ("cluster", CommonSettings, CLUSTER_FIELDS),
]


def help_text(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        sundial([command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("command", "settings", "fields"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_help_names_every_setting_the_command_reads(
    command: str, settings: type[BaseSettings], fields: tuple[str, ...] | None, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_text(command, capsys)
    names = fields if fields is not None else tuple(settings.model_fields)
    missing = [env_var(settings, name) for name in names if env_var(settings, name) not in text]
    assert not missing, f"`sundial {command} --help` does not name {missing}:\n{text}"


CONNECTION = ("SUNDIAL_DATABASE_URL", "SUNDIAL_REDIS_URL", "SUNDIAL_ETCD_ENDPOINT", "SUNDIAL_KAFKA_BOOTSTRAP")


@pytest.mark.parametrize("command", ["api", "dispatcher", "hydrator", "sweeper", "replayer", "worker", "analytics"])
def test_every_service_lists_the_connection_settings(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Spelled out, so a renamed prefix or a settings class that stops composing CommonSettings is caught.
    text = help_text(command, capsys)
    assert all(name in text for name in CONNECTION), text


def test_help_shows_defaults_and_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text("worker", capsys)
    assert "SUNDIAL_WORKER_SHUTDOWN_GRACE_SEC (default: 30.0)" in text
    assert "How long a stop waits for running handlers." in text
