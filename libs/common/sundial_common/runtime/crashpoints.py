"""Injectable crash points for fault tests.

``SUNDIAL_CRASH_POINT=dispatcher.after_claim`` makes the process die with SIGKILL semantics
(``os._exit``: no cleanup, no flush) the first time it reaches that point, so tests can prove that
a crash there loses nothing. Unset in production; checking it costs one dict lookup.

``SUNDIAL_PAUSE_POINT=dispatcher.after_claim`` instead makes the process stop itself (SIGSTOP) the first
time it gets there, as a GC pause or a frozen VM would, until someone sends SIGCONT: the fencing test
pauses a shard leader between claiming and committing, lets a successor take over, then resumes it.
"""

from __future__ import annotations

import logging
import os
import signal

_ARMED = os.environ.get("SUNDIAL_CRASH_POINT", "")
_PAUSE_AT = os.environ.get("SUNDIAL_PAUSE_POINT", "")
_paused = False


def crash_point(name: str) -> None:
    if _ARMED and _ARMED == name:
        logging.getLogger(__name__).critical("crash point %s reached: exiting now", name)
        logging.shutdown()
        os._exit(137)
    if _PAUSE_AT and _PAUSE_AT == name:
        _pause(name)


def _pause(name: str) -> None:
    global _paused
    if _paused:
        return
    _paused = True
    logging.getLogger(__name__).critical("pause point %s reached: stopping (SIGSTOP) until SIGCONT", name)
    os.kill(os.getpid(), signal.SIGSTOP)
