"""Where the generators find Sundial's code: the one place that names its modules."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from typing import Any

#: The settings class of each process, in the order the configuration page lists them ("common" first).
SETTINGS_CLASSES: dict[str, str] = {
    "common": "sundial_common.runtime.settings:CommonSettings",
    "api": "sundial_api.settings:ApiSettings",
    "dispatcher": "sundial_dispatcher.settings:DispatcherSettings",
    "hydrator": "sundial_hydrator.settings:HydratorSettings",
    "sweeper": "sundial_sweeper.settings:SweeperSettings",
    "worker": "sundial_worker.settings:WorkerSettings",
    "gateway": "sundial_gateway.settings:GatewaySettings",
    "replayer": "sundial_replayer.settings:ReplayerSettings",
    "analytics": "sundial_analytics.settings:AnalyticsSettings",
}

#: Packages whose modules declare metrics (each is imported whole before the registry is read).
METRIC_PACKAGES = (
    "sundial_common",
    "sundial_api",
    "sundial_dispatcher",
    "sundial_hydrator",
    "sundial_sweeper",
    "sundial_worker",
    "sundial_gateway",
    "sundial_replayer",
    "sundial_analytics",
)

#: The entry-point group of the ``sundial`` command's subcommands.
COMMAND_GROUP = "sundial.commands"


def load(spec: str) -> Any:
    """``"package.module:attribute"`` → the attribute."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the API serves at ``/openapi.json`` (built by its app factory; nothing is started)."""
    from sundial_api.app import create_app

    # The development settings: the document does not depend on them, and production ones would need keys.
    settings = load(SETTINGS_CLASSES["api"])(env="dev")
    document: dict[str, Any] = create_app(settings).openapi()
    return document


def gateway_openapi_document() -> dict[str, Any]:
    """The OpenAPI document the worker gateway serves at ``/openapi.json`` (nothing is started)."""
    from sundial_gateway.app import create_app

    settings = load(SETTINGS_CLASSES["gateway"])(env="dev")
    document: dict[str, Any] = create_app(settings).openapi()
    return document


def import_all(package: str) -> Iterator[str]:
    """Import every module of ``package`` (so that each declares its metrics); yields their names."""
    root = importlib.import_module(package)
    yield package
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        importlib.import_module(info.name)
        yield info.name


#: The module whose opening essay is the architecture's page on leadership.
LEADERSHIP_MODULE = "sundial_common.coordination.leadership"
