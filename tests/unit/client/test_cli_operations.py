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


def test_show_prints_it_or_follows_it_and_list_stops_at_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    op = Op(state="RUNNING", done=4)
    args = argparse.Namespace(json=False, wait=False, limit=2)
    assert operations.show(op, args, lambda o: FAILED, lambda o: f"op {o.state} {o.done}") == OK
    assert capsys.readouterr().out == "op RUNNING 4\n"
    assert operations.show(op, argparse.Namespace(json=False, wait=True), lambda o: FAILED, str) == FAILED
    found = iter([Op(state="RUNNING", done=1), Op(state="SUCCEEDED", done=2), Op(state="FAILED", done=3)])
    assert operations.print_list(found, args, ("STATE", "DONE"), lambda o: [o.state, o.done]) == OK
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].split() == ["STATE", "DONE"] and lines[2].split() == ["SUCCEEDED", "2"]
