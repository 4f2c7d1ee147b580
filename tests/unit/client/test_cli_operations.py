"""Following a long operation from the command line (``sundial bulk … --wait``, ``sundial replay … --wait``): a
progress line a poll, the summary once it has ended, exit 0 only if it SUCCEEDED."""

from __future__ import annotations

import argparse
import json

import pytest
from pydantic import BaseModel
from sundial_client.cli import operations
from sundial_client.cli.common import FAILED, OK


class Op(BaseModel):
    state: str
    done: int

    @property
    def ended(self) -> bool:
        return self.state in ("SUCCEEDED", "FAILED", "CANCELLED")


def _progress(now: Op, last: Op, dt: float) -> str:
    return f"{now.state} done {now.done} (+{now.done - last.done})"


def _summary(op: Op) -> str:
    return f"summary: {op.state}: {op.done} done"


def test_a_line_a_poll_then_the_summary_and_the_exit_code_of_its_end(capsys: pytest.CaptureFixture[str]) -> None:
    polls = [Op(state="RUNNING", done=10), Op(state="RUNNING", done=25), Op(state="SUCCEEDED", done=30)]
    args = argparse.Namespace(json=False)
    assert operations.follow(Op(state="PREPARING", done=0), polls, args, _progress, _summary) == OK
    assert capsys.readouterr().out.splitlines() == [
        "RUNNING done 10 (+10)",
        "RUNNING done 25 (+15)",
        "summary: SUCCEEDED: 30 done",
    ]
    failed = [Op(state="FAILED", done=3)]
    assert operations.follow(Op(state="RUNNING", done=0), failed, args, _progress, _summary) == FAILED


def test_with_json_each_poll_is_printed_whole_and_no_summary(capsys: pytest.CaptureFixture[str]) -> None:
    polls = [Op(state="RUNNING", done=1), Op(state="CANCELLED", done=2)]
    code = operations.follow(Op(state="RUNNING", done=0), polls, argparse.Namespace(json=True), _progress, _summary)
    assert code == FAILED
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"state": "RUNNING", "done": 1},
        {"state": "CANCELLED", "done": 2},
    ]
