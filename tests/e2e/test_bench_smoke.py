"""`make bench` still runs: a seconds-long smoke of the harness on its own stack.

A benchmark is not a test: nothing here looks at a timing. It checks that every workload of a tiny run
prints its JSON line with the figures the issue asks for, and that no job of the dispatch workloads was
lost or started twice (that is correctness, whatever the speed). It runs without git, or from a tree
that is not a checkout: the commit is recorded only when known.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench import machine
from tests.support.ports import port_offset

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_the_bench_records_the_commit_only_when_git_and_a_checkout_are_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("git") and (REPO / ".git").exists():
        assert machine.git_commit(REPO)  # a short hash, "-dirty" with uncommitted code
    # A tree that is not a checkout (an archive): no commit, no error.
    archive = tmp_path / "archive"
    (archive / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "machine.py", archive / "bench")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find a repository above it
    assert machine.git_commit(archive) is None
    # No git on PATH at all (a fresh machine): no commit, and the rest of the description still there.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert machine.git_commit(REPO) is None
    described = machine.describe(REPO, cpu_probe=False)
    assert described["commit"] is None and described["cores"] >= 1


def test_the_bench_harness_runs_every_dispatch_workload_and_records_its_figures(tmp_path: Path) -> None:
    # The harness starts its own servers on the bench ports, moved like this session's test ports.
    offset = port_offset()
    # Under the checkout's .sundial/ (not pytest's temp dir): `make clean` must find it if this run is killed.
    root = REPO / ".sundial" / ("bench-smoke" if offset == 0 else f"bench-smoke-{offset}")
    argv = [
        sys.executable,
        *("-m", "bench"),
        *("ceilings", "create", "w1", "w3", "curve"),  # W2 is W3's code with other numbers
        *("--scale", "0.01", "--burst", "2000", "--rates", "2000", "--duration", "2", "--lead", "2"),
        *("--curve-rates", "1000", "--curve-idle", "2"),
        *("--shards", "2", "--dispatchers", "1", "--workers", "1", "--no-durable"),
        *("--port-offset", str(offset), "--root", str(root), "--results", str(tmp_path / "results")),
    ]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280, check=False)
    shutil.rmtree(root, ignore_errors=True)  # the harness stopped its stack; its ~75 MB are of no further use
    assert run.returncode == 0, run.stderr[-3000:]

    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    by_workload = {line["workload"]: line for line in lines}
    assert set(by_workload) == {"ceilings", "create", "w1", "w3", "curve"}
    for line in lines:
        assert {"workload", "commit", "date", "machine", "settings", "figures"} <= set(line)
        assert {"cores", "memory_gib", "cpu_model", "kernel", "cpu_probe_s"} <= set(line["machine"])
        assert line["settings"]["shards"] == 2
    assert by_workload["ceilings"]["figures"]["postgres_insert"]["rows_per_s"] > 0
    # wrk's loads (bench/workloads/create.py): single creates, with and without Idempotency-Key, and batches; every
    # request answered 2xx, every job answered is written with its audit row.
    creates = [line for line in lines if line["workload"] == "create"]
    assert sorted((c["settings"]["created"], c["settings"]["idempotency_key"]) for c in creates) == [
        ("API batch", False),
        ("API single", False),
        ("API single", True),
    ]
    for line in (c["figures"] | c["settings"] for c in creates):
        assert line["requests"] > 0 and set(line["errors"].values()) == {0}, line
        assert line["jobs_written"] == line["audit_rows"] >= line["requests"] * line["batch_size"]
        assert {"api", "postgres", "wrk"} <= set(line["cpu_s"]) and line["api_cpu_ms_per_job"] > 0
    for name in ("w1", "w3"):
        line = by_workload[name]["figures"]
        assert line["jobs"] > 0
        assert (line["lost"], line["duplicate_starts"]) == (0, 0), line
        assert set(line["lateness_ms"]) == {"p50", "p95", "p99", "max"}
        assert {"dispatcher-0", "worker-0", "postgres", "broker"} <= set(line["cpu_s"])
    # The cost curve: what each execution cost at the rate, created through the API, by process and per hop.
    curve = by_workload["curve"]["figures"]
    assert curve["executions"] == curve["run"]["jobs"] > 0 and curve["lost"] == 0, curve
    assert by_workload["curve"]["settings"]["created"] == "API batch"
    # Every execution over 1 s late is counted under its cause (none in a healthy run: an empty mapping).
    causes = {"created_after_due", "unpublished", "dispatch", "produce", "consume_start"}
    assert set(curve["late_over_1s_by_cause"]) <= causes
    assert curve["net_cpu_ms_per_execution"] > 0 and curve["statements_per_execution"] > 0
    assert curve["transactions_per_execution"] > 0 and {"dispatcher-0", "worker-0"} <= set(curve["idle_cpu_s_per_s"])
    # The broker's produce requests come from its own OTLP export: at least one per second the jobs were due over.
    assert curve["produce_requests_per_execution"] is not None and curve["produce_requests_per_execution"] > 0
    # The same lines were appended to their workloads' results files, one file per workload.
    written = {path.stem: len(path.read_text().splitlines()) for path in (tmp_path / "results").glob("*.jsonl")}
    assert written == Counter(line["workload"] for line in lines)
