"""A test hook: hold the gateway at a named point of a call, so a fault test can kill it exactly there.

``SUNDIAL_GATEWAY_TEST_PAUSE_AT`` names the point — ``pull`` (messages taken from the broker, before their start),
``start`` (executions started and their liveness keys set, before the pull's answer) or ``finish`` (outcomes written,
before the finish's answer) — and the first call to reach it with work in hand logs ``test hook: paused at <point>``
and sleeps ``SUNDIAL_GATEWAY_TEST_PAUSE_SEC``; later calls pass. Unset (the default) it does nothing: production
never sets it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

log = logging.getLogger("sundial.gateway")

PausePoint = Literal["", "pull", "start", "finish"]


class PauseHook:
    """Pauses the first call that reaches ``point`` (inert when ``point`` is empty)."""

    def __init__(self, point: PausePoint = "", pause_sec: float = 0.0) -> None:
        self.point = point
        self.pause_sec = pause_sec
        #: Whether a call reached the point (and was held).
        self.fired = False

    async def reach(self, point: PausePoint) -> None:
        if not self.point or point != self.point or self.fired:
            return
        self.fired = True
        log.warning("test hook: paused at %s for %.0fs", point, self.pause_sec)
        await asyncio.sleep(self.pause_sec)
