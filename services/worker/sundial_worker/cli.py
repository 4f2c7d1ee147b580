"""`sundial worker`: serve one pool's handlers from Kafka until SIGTERM/SIGINT.

``sundial worker --app mymodule:worker`` imports ``worker`` (a :class:`~sundial_worker.sdk.Worker`)
from ``mymodule`` — the current directory is importable, as with uvicorn — and runs it with
:class:`~sundial_worker.runtime.WorkerRuntime`. The first signal stops gracefully (running handlers
get the shutdown grace); copies of it arriving within a second (one Ctrl-C under `uv run` arrives twice)
change nothing, and only a deliberate later signal cuts the grace short (``sundial_common.runtime.stop_signals``).

**From any directory.** Variables the environment leaves unset come from the running development stack's record
(``sundial_common.runtime.dev_stack``: ``make up`` writes it), so on a developer machine the command works
verbatim from the user's own project. A configuration that cannot work — no master key, a dev root that does
not exist, a database that does not answer — is one line on stderr naming the setting, and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys

from sundial_common.runtime.dev_stack import pointer_path, use_running_stack
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.service import run
from sundial_common.runtime.settings import SettingsHelpParser, load_settings
from sundial_common.security.encryption import MasterKeyError, master_key_provider

from sundial_worker.errors import StartupError
from sundial_worker.gateway_runtime import GatewayRuntime
from sundial_worker.http_target import TargetDelivery, delivery_worker
from sundial_worker.sdk import Worker
from sundial_worker.settings import WorkerSettings
from sundial_worker.staging import ServingRuntime

log = logging.getLogger("sundial.worker")

#: Allocations between young-generation collections (CPython's default: 700). An execution allocates a few dozen
#: short-lived objects (its message, task, context, outcome), almost none in cycles; at 700 a young collection
#: ran every ~40 executions, with an older one every tenth (bench/worker_python.py: ~5 µs of ~45 per execution).
GC_THRESHOLD = 7000
#: A delivery worker's requests in flight at once by default: each mostly waits on the network.
DELIVERY_CONCURRENCY = 64


class AppError(Exception):
    """``--app`` does not name a Worker; the message says why."""


def load_worker(spec: str) -> Worker:
    """The Worker named by ``module:attribute`` (``module`` alone means ``module:worker``)."""
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "worker"
    if not module_name:
        raise AppError(f"--app {spec!r}: expected `module:attribute`, e.g. `mymodule:worker`")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise AppError(f"--app {spec!r}: no module named {exc.name!r} (is it on PYTHONPATH?)") from exc
        raise  # the module exists but one of its own imports failed: show the real traceback
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise AppError(f"--app {spec!r}: module {module_name!r} has no attribute {attribute!r}") from exc
    if not isinstance(target, Worker):
        raise AppError(f"--app {spec!r} is a {type(target).__name__}, not a sundial_worker.Worker")
    return target


def _parser() -> argparse.ArgumentParser:
    parser = SettingsHelpParser(
        settings=WorkerSettings,
        prog="sundial worker",
        description="Consume a pool's executions from Kafka and run their handlers: claim each one with a "
        "compare-and-swap in Postgres, record its outcome, commit the offset only after that write. With "
        "SUNDIAL_WORKER_GATEWAY set, run them through the worker gateway instead, holding only a pool token. "
        "With --http-target, be a delivery worker: POST each execution of an HTTP pool to its target. "
        "SIGTERM/SIGINT stop gracefully; a second signal more than a second later abandons running handlers to "
        "the sweeper.",
    )
    parser.add_argument("--app", help="The Worker to serve, as module:attribute (env SUNDIAL_WORKER_APP).")
    parser.add_argument(
        "--http-target",
        metavar="POOL",
        help="Be a delivery worker of POOL, whose delivery is http: POST each execution to the pool's target "
        "(env SUNDIAL_WORKER_HTTP_TARGET).",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        help="Handlers running at once (env SUNDIAL_WORKER_CONCURRENCY; default: the Worker's concurrency).",
    )
    parser.add_argument(
        "--worker-id", help="Identity in attempts and heartbeats (env SUNDIAL_WORKER_ID; default: host-pid)."
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        help="Seconds a stop waits for running handlers (env SUNDIAL_WORKER_SHUTDOWN_GRACE_SEC; default 30).",
    )
    parser.add_argument("--log-level", help="Logging level (env SUNDIAL_LOG_LEVEL; default INFO).")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="Serve Prometheus metrics at /metrics on this port (env SUNDIAL_METRICS_PORT; default: not served).",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a pool's handlers (`sundial worker --app module:worker`)."""
    parser = _parser()
    args = parser.parse_args(argv)
    dev_stack = use_running_stack()
    overrides = {
        "worker_app": args.app,
        "worker_http_target": args.http_target,
        "worker_concurrency": args.concurrency,
        "worker_id": args.worker_id,
        "worker_shutdown_grace_sec": args.shutdown_grace,
        "log_level": args.log_level,
        "metrics_port": args.metrics_port,
    }
    settings = load_settings(WorkerSettings, parser, **overrides)
    setup_logging(settings.log_level, settings.log_format)
    if dev_stack is not None:
        log.info("using the development stack under %s (recorded in %s)", dev_stack.root, pointer_path())
    if not settings.worker_app and not settings.worker_http_target:
        parser.error("--app is required (or set SUNDIAL_WORKER_APP), e.g. --app sundial_worker.demo:worker")
    if settings.worker_app and settings.worker_http_target:
        parser.error("give --app or --http-target, not both: a delivery worker runs no handlers of its own")
    runtime: ServingRuntime | GatewayRuntime
    target: TargetDelivery | None = None
    try:
        if settings.worker_http_target:
            # httpx logs every request at INFO: a line per execution here; the sender's own log says what failed.
            logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
            target = TargetDelivery(
                settings,
                settings,
                completion_base_url=settings.worker_target_completion_url,
                hold_sec=settings.worker_target_hold_sec,
            )
            worker = delivery_worker(
                settings.worker_http_target, target, concurrency=settings.worker_concurrency or DELIVERY_CONCURRENCY
            )
        else:
            worker = load_worker(settings.worker_app or "")
        if settings.worker_gateway and target is None:
            # The gateway transport: a pool token only, no database, Redis, broker or master key.
            runtime = GatewayRuntime(worker, settings.gateway_config(worker))
        else:
            config = settings.runtime_config(worker)
            master_key_provider(settings)  # a missing key or dev root is found now, before any connection
            # A staging pool (its kind in the registry) is fed only by replays: its runtime records replay_runs,
            # never executions (staging.py).
            runtime = ServingRuntime(worker, settings, config=config, worker_id=settings.identity())
    except (AppError, ValueError, MasterKeyError) as exc:
        print(f"sundial worker: {exc}", file=sys.stderr)
        return 2

    def abandon_running_handlers() -> None:
        log.warning("second signal: abandoning running handlers now")
        runtime.force_stop()

    refused: list[str] = []

    async def serve(stop: asyncio.Event) -> None:
        try:
            await runtime.run_until(stop)
        except (StartupError, MasterKeyError) as exc:  # a configuration problem: one line, not a traceback
            refused.append(str(exc))
        finally:
            if target is not None:
                await target.close()

    with observed("sundial-worker", settings):
        code = run(serve, on_force=abandon_running_handlers, young_collection_every=GC_THRESHOLD)
    if refused:
        print(f"sundial worker: {refused[0]}", file=sys.stderr)
        return 2
    if runtime.stuck_sync_handlers:
        # A sync handler's thread cannot be interrupted, and the interpreter would wait for it at
        # exit; everything that matters is written and committed, so leave without it.
        log.warning("%d sync handler threads still running; exiting without them", runtime.stuck_sync_handlers)
        logging.shutdown()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
