"""Injectable crash points for fault tests.

``SUNDIAL_CRASH_POINT=dispatcher.after_claim`` makes the process die with SIGKILL semantics
(``os._exit``: no cleanup, no flush) the first time it reaches that point, so tests can prove that
a crash there loses nothing. Unset in production; checking it costs one dict lookup.
"""

from __future__ import annotations

import logging
import os

_ARMED = os.environ.get("SUNDIAL_CRASH_POINT", "")


def crash_point(name: str) -> None:
    if _ARMED and _ARMED == name:
        logging.getLogger(__name__).critical("crash point %s reached: exiting now", name)
        logging.shutdown()
        os._exit(137)
