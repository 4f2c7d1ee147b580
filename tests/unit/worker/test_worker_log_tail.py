"""What an attempt keeps for the person reading it: the handler's log tail and traceback, bounded."""

from __future__ import annotations

import concurrent.futures
import logging
from pathlib import Path
from typing import Any

from sundial_worker import log_tail
from sundial_worker.log_tail import MAX_CHARS, MAX_LINES, MAX_TRACEBACK_CHARS, TailingLogger, traceback_text


def test_the_log_tail_keeps_the_last_lines_within_its_bounds() -> None:
    logger = TailingLogger(logging.getLogger("test.tail"), {"tenant": "t"})
    logger.logger.setLevel(logging.INFO)
    assert logger.text() is None
    logger.debug("not enabled: not kept")
    for i in range(MAX_LINES + 50):
        logger.info("line %d", i)
    lines = (logger.text() or "").splitlines()
    assert len(lines) == MAX_LINES and lines[-1].endswith(f" INFO line {MAX_LINES + 49}")
    for _ in range(100):
        logger.warning("x" * 5000)
    text = logger.text() or ""
    assert len(text) <= MAX_CHARS and text.splitlines()[-1].endswith("…")
    try:
        raise ValueError("bad input")
    except ValueError:
        logger.exception("failed")
    assert (logger.text() or "").endswith("ERROR failed (ValueError: bad input)")


def test_a_traceback_keeps_its_innermost_frames() -> None:
    def inner() -> None:
        raise RuntimeError("x" * 20_000 + " at the bottom")

    try:
        inner()
    except RuntimeError as exc:
        text = traceback_text(exc)
    assert len(text) == MAX_TRACEBACK_CHARS and text.startswith("…")
    assert text.rstrip().endswith("x at the bottom")


def test_a_traceback_starts_at_the_handler_not_in_the_runtime_that_awaited_it() -> None:
    def handler() -> None:
        raise KeyError("missing")

    # The runtime catches a sync handler's exception where it reads the thread pool's future (execution.py).
    runtime = str(Path(log_tail.__file__).with_name("execution.py"))
    code = "def awaiting(future, describe):\n    try:\n        future.result()\n    except KeyError as exc:\n"
    namespace: dict[str, Any] = {}
    exec(compile(code + "        return describe(exc)\n", runtime, "exec"), namespace)
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        text = namespace["awaiting"](threads.submit(handler), traceback_text)
    frames = [line for line in text.splitlines() if line.startswith("  File ")]
    assert len(frames) == 1 and __file__ in frames[0], text
    assert text.startswith("Traceback (most recent call last):") and text.rstrip().endswith("KeyError: 'missing'")
