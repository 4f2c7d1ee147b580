"""Which release runs is one command away: ``sundial --version``, and every process logs it as it starts."""

from __future__ import annotations

import logging
from importlib.metadata import version

import pytest
from sundial_client.command import main
from sundial_common.runtime.instrumentation import announce


def test_sundial_version_prints_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"sundial {version('sundial-client')}\n"


def test_a_process_logs_its_release_as_it_starts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sundial_common.runtime.instrumentation")
    announce("sundial-test", "test-1")  # what observed() does first (not run here: it replaces the tracer)
    assert f"sundial-test {version('sundial-common')} starting (instance test-1)" in caplog.text
