"""`sundial services --run hydrator,sweeper,replayer`: several singleton services in one process.

Each idle Python process costs the machine about the same whatever it runs (~0.0015–0.002 core: its event loop,
its etcd client's gRPC threads, its metrics endpoint; measured by bench/workloads/idle.py), and the
hydrator, the sweeper and the replayer are each a mostly idle loop with a standby. Hosting them together turns
six such processes into two. Nothing about the services changes: each keeps its own settings, its own registry
entry and election (its own lease), so a standby takes one role over exactly as it would from a process of its
own; they only share the event loop, the process's metrics registry and ``/metrics`` port, and its log.

A service offers itself to a host as a :class:`HostedService` under the entry-point group ``sundial.services``
(``hydrator = "sundial_hydrator.cli:SERVICE"``); its own command (``sundial hydrator``) runs the same ``serve``
alone, which is what production deployments may keep doing.

**One dies, the process exits.** A service whose life ends with an error (or before it was asked to stop) must not
leave the others running in a process that looks alive: the host asks the others to stop (each finishes its
pass and resigns, so their standbys lead at once), waits up to :data:`STOP_GRACE_SEC` for them, then exits
non-zero so that the supervisor restarts it — meanwhile the standbys in the other host lead every role.

Every log line a hosted service writes (its own and those of the shared code it calls: leadership, registry)
says ``service=<name>`` (:data:`sundial_common.runtime.logs.SERVICE`, set in each service's task context).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import SERVICE, setup_logging
from sundial_common.runtime.service import run
from sundial_common.runtime.settings import CommonSettings, SettingsHelpParser, load_settings

__all__ = ["GROUP", "STOP_GRACE_SEC", "HostedService", "hosted_services", "main", "run_side_by_side"]

log = logging.getLogger("sundial.services")

GROUP = "sundial.services"
"""Entry-point group under which a service package offers its :class:`HostedService`."""

STOP_GRACE_SEC = 10.0
"""After one hosted service failed: how long the others get to finish their pass and resign before they are
cancelled. Below the dev supervisor's 15 s between SIGTERM and SIGKILL; a pass of these loops takes well under a
second idle, and a longer one only delays the restart."""

_S = TypeVar("_S", bound=CommonSettings)

Life = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""A service's life: runs until the event is set, then returns (raising means it failed)."""


@dataclass(frozen=True)
class HostedService(Generic[_S]):
    """What a service gives a host: its settings class (read from the environment) and its life given them."""

    name: str
    settings: type[_S]
    serve: Callable[[_S, asyncio.Event], Coroutine[Any, Any, None]]

    def life(self, parser: argparse.ArgumentParser) -> Life:
        """The service's life with its settings read now (a bad value exits 2 through ``parser``, at start-up)."""
        settings = load_settings(self.settings, parser)

        async def live(stop: asyncio.Event) -> None:
            await self.serve(settings, stop)

        return live


def hosted_services() -> dict[str, HostedService[Any]]:
    """The services installed that a host can run, by name."""
    found: dict[str, HostedService[Any]] = {}
    for ep in entry_points(group=GROUP):
        service = ep.load()
        if not isinstance(service, HostedService):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a HostedService")
        found[ep.name] = service
    return found


async def run_side_by_side(
    stop: asyncio.Event, lives: Mapping[str, Life], *, grace_sec: float = STOP_GRACE_SEC
) -> None:
    """Run every life until ``stop``; if one fails or ends early, stop the others and raise.

    Each runs in a task of its own whose context names the service for the logs (:data:`SERVICE`).
    """
    tasks: dict[asyncio.Task[None], str] = {}
    for name, life in lives.items():
        context = contextvars.copy_context()
        context.run(SERVICE.set, name)
        tasks[asyncio.create_task(life(stop), name=name, context=context)] = name
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # stopped by force (a second signal): every service now, not at the loop's end
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    failure: BaseException | None = None
    for task in done:
        if task.cancelled():
            continue
        if (exc := task.exception()) is not None:
            log.error("service %s failed: %r; stopping the others so their standbys take over", tasks[task], exc)
            failure = failure or exc
        elif not stop.is_set():
            log.error("service %s ended before it was asked to stop; stopping the others", tasks[task])
            failure = failure or RuntimeError(f"service {tasks[task]} ended unexpectedly")
    stop.set()
    if pending:
        finished, late = await asyncio.wait(pending, timeout=grace_sec)
        for task in late:
            log.error("service %s did not stop within %.0fs; cancelling it", tasks[task], grace_sec)
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        for task in finished:
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("service %s failed while stopping: %r", tasks[task], exc)
                failure = failure or exc
    if failure is not None:
        raise failure


def main(argv: list[str] | None = None) -> int:
    """Run several singleton services (hydrator, sweeper, replayer) in one process"""
    available = hosted_services()
    parser = SettingsHelpParser(
        settings=CommonSettings,
        prog="sundial services",
        description="Run several singleton services in one process, side by side on one event loop: each keeps "
        "its own settings (the variables of its own command), registry entry and election, so it fails over to a "
        "standby exactly as its own command would. One /metrics endpoint and one log for all of them; every line "
        "says service=<name>. If one service fails, the others stop and the process exits 1 (the supervisor "
        f"restarts it). Services available: {', '.join(sorted(available)) or 'none'}.",
    )
    parser.add_argument("--run", required=True, help="Comma-separated services to run, e.g. hydrator,sweeper,replayer.")
    parser.add_log_and_metrics_arguments()
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.run.split(",") if name.strip()]
    unknown = sorted(set(names) - set(available))
    if not names or unknown or len(set(names)) != len(names):
        parser.error(
            f"--run needs distinct names among {', '.join(sorted(available))}; got {args.run!r}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    settings = load_settings(CommonSettings, parser, metrics_port=args.metrics_port)
    setup_logging(args.log_level or settings.log_level, settings.log_format)
    lives = {name: available[name].life(parser) for name in names}

    async def serve(stop: asyncio.Event) -> None:
        log.info("hosting %s", ", ".join(names))
        await run_side_by_side(stop, lives)

    with observed("sundial-services", settings):
        return run(serve)
