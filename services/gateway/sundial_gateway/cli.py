"""``sundial gateway``: run one worker gateway replica under uvicorn.

Options fall back to ``SUNDIAL_*`` environment variables, then to the defaults in
:class:`~sundial_gateway.settings.GatewaySettings`. SIGTERM and SIGINT stop it gracefully: uvicorn stops accepting,
finishes the calls in flight (a long poll answers with what it has), then the feeds leave their consumer groups.
Replicas are interchangeable: run several behind one address, or give workers every replica's URL.
"""

from __future__ import annotations

import argparse

import uvicorn
from sundial_common.runtime.instrumentation import observed
from sundial_common.runtime.logs import setup_logging
from sundial_common.runtime.settings import SettingsHelpParser, load_settings

from sundial_gateway.app import create_app
from sundial_gateway.settings import GatewaySettings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Calls still running this long after SIGTERM are abandoned (a long poll is at most this long anyway).
GRACEFUL_SHUTDOWN_SEC = 30


def _parser() -> argparse.ArgumentParser:
    parser = SettingsHelpParser(
        settings=GatewaySettings,
        prog="sundial gateway",
        description="Run the worker gateway: workers in any language, holding only a pool token, pull, heartbeat "
        "and finish a pool's executions over HTTP (one stateless replica; run more for more throughput).",
    )
    parser.add_argument("--host", default=None, help="Interface to bind (env SUNDIAL_GATEWAY_HOST; default 127.0.0.1).")
    parser.add_argument(
        "--port", type=int, default=None, help="TCP port to bind (env SUNDIAL_GATEWAY_PORT; default 8081)."
    )
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
    overrides = {"gateway_host": args.host, "gateway_port": args.port, "log_level": args.log_level}
    settings = load_settings(GatewaySettings, parser, **overrides)
    setup_logging(settings.log_level, settings.log_format)
    try:
        app = create_app(settings)
    except ValueError as exc:
        parser.error(str(exc))
    config = uvicorn.Config(
        app,
        host=settings.gateway_host,
        port=settings.gateway_port,
        loop="uvloop",
        lifespan="on",
        log_config=None,
        log_level=settings.log_level.lower(),
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SEC,
    )
    server = uvicorn.Server(config)
    with observed("sundial-gateway", settings):
        server.run()
    return 0 if server.started else 3


if __name__ == "__main__":
    raise SystemExit(main())
