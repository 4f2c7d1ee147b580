"""The bench's results files: a run's line lands in its workload's file, and the performance page's readers
(``latest``, ``current_table``) pick the figures a reader would call current."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import results


def line(workload: str, commit: str, date: str, p95: float, **settings: Any) -> dict[str, Any]:
    return {
        "workload": workload,
        "commit": commit,
        "date": date,
        "machine": {"cores": 2},
        "settings": {"shards": 8, **settings},
        "figures": {"lateness_ms": {"p95": p95}},
    }


def write(directory: Path, *lines: dict[str, Any]) -> None:
    for each in lines:
        with (directory / f"{each['workload']}.jsonl").open("a") as out:
            out.write(json.dumps(each) + "\n")


def test_a_run_appends_one_line_with_commit_date_machine_settings_and_figures_to_its_workloads_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results.record("w1", {"lost": 0}, {"burst": 10}, results=tmp_path, cpu_probe=False)
    results.record("w1", {"lost": 1}, {"burst": 20}, results=tmp_path, cpu_probe=False)

    (path,) = tmp_path.iterdir()
    assert path.name == "w1.jsonl"
    written = [json.loads(text) for text in path.read_text().splitlines()]
    assert [w["figures"]["lost"] for w in written] == [0, 1]
    assert {"workload", "commit", "date", "machine", "settings", "figures"} <= set(written[0])
    assert {"cores", "memory_gib", "cpu_model", "kernel"} <= set(written[0]["machine"])
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == written[0]  # printed as written


def test_latest_is_the_newest_line_whose_settings_match(tmp_path: Path) -> None:
    write(
        tmp_path,
        line("w1", "aaa", "2026-11-20T10:00:00+00:00", 900, burst=10_000),
        line("w1", "bbb", "2026-11-21T10:00:00+00:00", 800, burst=10_000),
        line("w1", "bbb", "2026-11-21T10:05:00+00:00", 5000, burst=100_000),
    )

    assert results.latest("w1", results=tmp_path)["figures"]["lateness_ms"]["p95"] == 5000
    assert results.latest("w1", results=tmp_path, burst=10_000)["commit"] == "bbb"
    with pytest.raises(LookupError):
        results.latest("w1", results=tmp_path, burst=1)
    with pytest.raises(LookupError):
        results.latest("w9", results=tmp_path)


def test_the_current_table_holds_each_series_of_the_newest_commit_once(tmp_path: Path) -> None:
    write(
        tmp_path,
        line("w3", "old", "2026-11-20T10:00:00+00:00", 400, target_per_s=10_000),  # not measured again since
        line("w3", "new", "2026-11-21T10:00:00+00:00", 300, target_per_s=1000),
        line("w3", "new", "2026-11-21T11:00:00+00:00", 250, target_per_s=1000),
        line("w3", "new", "2026-11-21T11:05:00+00:00", 350, target_per_s=2500),
        line("idle", "old", "2026-11-19T10:00:00+00:00", 0),
    )

    table = results.current_table(tmp_path)

    assert [(row["workload"], row["settings"].get("target_per_s"), row["figures"]["lateness_ms"]["p95"])
            for row in table] == [("idle", None, 0), ("w3", 1000, 250), ("w3", 2500, 350)]  # fmt: skip
