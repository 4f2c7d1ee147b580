"""``sundial api``: run one API replica under uvicorn (uvloop event loop, httptools parser, one write per response).

Options fall back to ``SUNDIAL_*`` environment variables, then to the defaults in
:class:`~sundial_api.settings.ApiSettings`. SIGTERM and SIGINT stop it gracefully: uvicorn stops
accepting, finishes in-flight requests, then the lifespan closes the database and Redis pools. Signals are
read as every Sundial process reads them (``sundial_common.runtime.stop_signals``): uvicorn alone would take the
second copy of one Ctrl-C under `uv run` as "exit now".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
from types import FrameType

import uvicorn
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.service import freeze_startup_heap
from sundial_common.runtime.settings import SettingsHelpParser, load_settings
from sundial_common.runtime.stop_signals import StopSignals

from sundial_api.admin import register_replica
from sundial_api.app import create_app
from sundial_api.console.events import close_streams
from sundial_api.http_protocol import CoalescingHttpToolsProtocol
from sundial_api.settings import ApiSettings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Requests still running this long after SIGTERM are abandoned, so a stuck client cannot block a deploy.
GRACEFUL_SHUTDOWN_SEC = 30
#: Allocations between young-generation collections (CPython's default: 700).
GC_THRESHOLD = 7000


class _Server(uvicorn.Server):
    """uvicorn's server with Sundial's reading of stop signals (duplicates ignored, a later one forces)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._signals = StopSignals(self._stop, self._force)
        self._exiting: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def _stop(self) -> None:
        self.should_exit = True
        close_streams()  # the console's open event streams would hold the graceful stop until its timeout
        if self._exiting is not None:  # a signal handler: wake the loop through its self-pipe
            loop, exiting = self._exiting
            loop.call_soon_threadsafe(exiting.set)

    def _force(self) -> None:
        self.force_exit = True

    async def main_loop(self) -> None:
        """uvicorn's loop, woken by the stop rather than every 100 ms to look for it.

        uvicorn's own ``main_loop`` sleeps 0.1 s between looks at ``should_exit``: 10 wake-ups a second of an
        idle API (strace), most of its idle CPU. Here the stop sets an event, and the loop ticks once a second
        for what ``on_tick`` does then (the Date header).
        """
        exiting = asyncio.Event()
        self._exiting = (asyncio.get_running_loop(), exiting)
        while not await self.on_tick(0):  # counter 0: the once-a-second work, every time
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(exiting.wait(), 1.0)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in uvicorn's captured signals: uvicorn would re-raise them after the shutdown and
        # turn a clean graceful stop into a KeyboardInterrupt traceback.
        self._signals.handle(sig)


def _parser() -> argparse.ArgumentParser:
    parser = SettingsHelpParser(
        settings=ApiSettings,
        prog="sundial api",
        description="Run the Sundial HTTP API (one stateless replica; run more for more throughput).",
    )
    parser.add_argument("--host", default=None, help="Interface to bind (env SUNDIAL_HOST; default 127.0.0.1).")
    parser.add_argument("--port", type=int, default=None, help="TCP port to bind (env SUNDIAL_PORT; default 8080).")
    parser.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=LOG_LEVELS,
        help="Logging level (env SUNDIAL_LOG_LEVEL; default INFO).",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    overrides = {"host": args.host, "port": args.port, "log_level": args.log_level}
    settings = load_settings(ApiSettings, parser, **overrides)

    setup_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    register_replica(app)  # a served replica shows up in the cluster view (GET /v1/admin/cluster)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=CoalescingHttpToolsProtocol,  # httptools, each response in one write
        lifespan="on",
        log_config=None,  # keep the process's logging setup (text or JSON lines)
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SEC,
    )
    server = _Server(config)
    # What is built by now (modules, pydantic schemas, the app) is frozen, as in every service. And young collections
    # run ten times rarer: a create allocates hundreds of short-lived objects, almost none of them in cycles
    # (py-spy under wrk: ~8% of the API's CPU in the collector at the default threshold of 700).
    freeze_startup_heap()
    gc.set_threshold(GC_THRESHOLD, 10, 10)
    # The API serves /metrics on its own port (sundial_api.health), not on SUNDIAL_METRICS_PORT.
    with observed("sundial-api", settings, metrics=False):
        server.run()
    # uvicorn returns without starting when the lifespan failed (e.g. Postgres unreachable).
    return 0 if server.started else 3


if __name__ == "__main__":
    raise SystemExit(main())
