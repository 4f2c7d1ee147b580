"""StopSignals: one Ctrl-C that arrives twice is one graceful stop; a deliberate later one forces."""

from __future__ import annotations

import signal

from sundial_common.runtime.stop_signals import DUPLICATE_WINDOW_SEC, StopSignals
from sundial_common.testing import FakeClock


def make(with_force: bool = True) -> tuple[StopSignals, list[str], FakeClock]:
    calls: list[str] = []
    clock = FakeClock()
    signals = StopSignals(
        lambda: calls.append("stop"), (lambda: calls.append("force")) if with_force else None, clock=clock.monotonic
    )
    return signals, calls, clock


def test_the_first_signal_stops_gracefully() -> None:
    signals, calls, _ = make()
    signals.handle(signal.SIGTERM)
    assert calls == ["stop"] and signals.stopping and not signals.forced


def test_a_copy_within_the_window_is_the_same_request() -> None:
    # The terminal's SIGINT and `uv run`'s forwarded copy, ~200 ms apart.
    signals, calls, clock = make()
    signals.handle(signal.SIGINT)
    clock.advance(0.2)
    signals.handle(signal.SIGINT)
    clock.advance(DUPLICATE_WINDOW_SEC - 0.3)
    signals.handle(signal.SIGTERM)
    assert calls == ["stop"] and not signals.forced


def test_a_deliberate_later_signal_forces_once() -> None:
    signals, calls, clock = make()
    signals.handle(signal.SIGINT)
    clock.advance(0.2)
    signals.handle(signal.SIGINT)
    clock.advance(DUPLICATE_WINDOW_SEC)
    signals.handle(signal.SIGINT)
    clock.advance(5)
    signals.handle(signal.SIGINT)
    assert calls == ["stop", "force"] and signals.forced


def test_without_a_force_action_the_stop_stays_graceful() -> None:
    signals, calls, clock = make(with_force=False)
    signals.handle(signal.SIGINT)
    clock.advance(10)
    signals.handle(signal.SIGINT)
    assert calls == ["stop"] and not signals.forced
