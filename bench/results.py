"""The bench's results: one JSON line per run in ``bench/results/<workload>.jsonl``, and the current figures.

Every workload records through :func:`record`, which appends one line to its workload's file (and prints it):

``workload``
    the name ``python -m bench`` knows it by, also the file's name (``w1``, ``create``, ``dispatch-python``…);
``commit``
    the short git commit measured, ``-dirty`` when the code had uncommitted changes, ``null`` when unknown;
``date``
    when the line was recorded, ISO 8601 in UTC;
``machine``
    what it ran on (:func:`bench.machine.describe`): ``cores``, ``memory_gib``, ``cpu_model``, ``kernel``,
    ``python`` and ``cpu_probe_s``, the seconds a fixed piece of Python took (the machine's speed at the time);
``settings``
    how the run was set up: the stack's shape (shards, dispatchers, workers…) and the workload's own parameters
    (a W1 burst's size, a W3 rate…); lines of one workload with equal settings are one series;
``figures``
    what was measured.

Lines converted from the older dated files also carry ``recovered``: the fields (``commit``, ``date``) that the
older line did not hold and that were taken from the git history of its file (the commit that added the line).

Profiles, flame graphs and other scratch output are not results: they go under :data:`SCRATCH`
(``.sundial/bench/``), outside git.

Reading, for a generator of the performance page:

- :func:`latest` ``(workload, **settings)`` is the newest line of ``workload`` whose settings hold the given
  items, e.g. ``latest("w1", burst=10_000)["figures"]["lateness_ms"]["p95"]``;
- :func:`current_table` is every workload's current figures: per workload, the newest line of each series among
  the lines of the workload's newest commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import machine

#: The checkout the bench runs from.
REPO = Path(__file__).resolve().parent.parent
#: Where the per-workload files are (in git).
RESULTS = REPO / "bench" / "results"
#: Where profiles and other scratch output go (not in git; ``make clean`` deletes it).
SCRATCH = REPO / ".sundial" / "bench"


def record(
    workload: str,
    figures: Mapping[str, Any],
    settings: Mapping[str, Any] | None = None,
    *,
    results: Path = RESULTS,
    cpu_probe: bool = True,
) -> dict[str, Any]:
    """Append one line for a run of ``workload`` to ``results/<workload>.jsonl``, print it and return it.

    The commit, the date and the machine are added here (``cpu_probe``: time the machine's speed, a second of
    CPU; off for a workload that measures an idle machine)."""
    described = machine.describe(REPO, cpu_probe=cpu_probe)
    line = {
        "workload": workload,
        "commit": described.pop("commit"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": described,
        "settings": dict(settings or {}),
        "figures": dict(figures),
    }
    text = json.dumps(line, default=str)
    print(text, flush=True)
    results.mkdir(parents=True, exist_ok=True)
    with (results / f"{workload}.jsonl").open("a") as out:
        out.write(text + "\n")
    return line


def lines(workload: str, results: Path = RESULTS) -> Iterator[dict[str, Any]]:
    """Every line of ``workload``, oldest first (none if it has no file)."""
    path = results / f"{workload}.jsonl"
    if not path.exists():
        return
    with path.open() as source:
        for text in source:
            if text.strip():
                yield json.loads(text)


def workloads(results: Path = RESULTS) -> list[str]:
    """The workloads that have a results file, by name."""
    return sorted(path.stem for path in results.glob("*.jsonl"))


def latest(workload: str, results: Path = RESULTS, **settings: Any) -> dict[str, Any]:
    """The newest line of ``workload`` whose settings hold every item of ``settings``.

    Raises :class:`LookupError` when there is none."""
    found = None
    for line in lines(workload, results):
        if all(line["settings"].get(key) == value for key, value in settings.items()):
            if found is None or line["date"] >= found["date"]:
                found = line
    if found is None:
        raise LookupError(f"no {workload} line with settings {settings!r} in {results}")
    return found


def current_table(results: Path = RESULTS) -> list[dict[str, Any]]:
    """The current figures: for each workload, the newest line of each series (equal settings) among the lines of
    the workload's newest commit, ordered by workload then date. Each row is a line as :func:`record` wrote it."""
    table: list[dict[str, Any]] = []
    for workload in workloads(results):
        all_lines = list(lines(workload, results))
        if not all_lines:
            continue
        newest = max(all_lines, key=lambda line: line["date"])
        series: dict[str, dict[str, Any]] = {}
        for line in all_lines:
            if line["commit"] != newest["commit"]:
                continue
            key = json.dumps(line["settings"], sort_keys=True, default=str)
            if key not in series or line["date"] >= series[key]["date"]:
                series[key] = line
        table.extend(sorted(series.values(), key=lambda line: line["date"]))
    return table
