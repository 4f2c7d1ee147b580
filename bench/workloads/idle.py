"""Idle: what the whole ``make up`` stack costs while nothing is scheduled.

    uv run python -m bench.workloads.idle --port-offset 700 --seconds 30   # settle 30 s, measure 30 s
    uv run python -m bench idle --port-offset 700         # settle 30 s, measure 60 s (`make bench BENCH_ARGS=idle`)
    uv run python -m bench idle-floor                     # the floor: the servers alone, no Sundial process

It runs the development environment of ``make up`` — ``sundial_infra.dev_runner.DevRunner`` with its
default process table (api, two dispatchers, the two hosts of the hydrator, sweeper and replayer —
``services-1/2`` — analytics, the two demo workers), its durable Postgres, Redis, etcd, the broker and
Prometheus scraping every process — in a child process of its own (``--serve``), on the bench ports +
``--port-offset`` under ``.sundial/bench-idle/`` (wiped first). Once the API is ready and both workers hold
partitions it waits ``--settle`` seconds (start-up work: migrations' aftermath, elections, first scrapes), then reads
utime+stime of every process from ``/proc`` at the start and the end of ``--seconds`` and prints one JSON
line: CPU per process in cores (Postgres with its backends, each process with whatever it forked), the
total, and the memory of each (PSS, so Postgres' shared buffers count once: "make up memory"). It appends
the line to ``bench/results/<workload>.jsonl``. A measurement, not a test.

``--servers-only`` measures the floor under that figure: the same servers, set up the same way (migrated, the
demo tenant and pools registered), with no Sundial process at all (Prometheus then has nothing to scrape).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sundial_infra.dev_runner import DevLayout, DevRunner, readyz_ok
from sundial_infra.process import read_pid_file, wait_for
from sundial_infra.stack import BENCH_PORTS, LocalStack, Ports
from sundial_infra.supervisor import default_processes

from bench import machine, results
from bench.harness import log_mentions
from bench.results import REPO, RESULTS

#: The replicas' /metrics ports: right above the API's port of the same set (the dev stack uses 19100-19115).
METRICS_PORT_GAP = 1
#: The analytics stats endpoint: as in bench/harness.py, api + 44 (the dev stack's is 8124).
ANALYTICS_PORT_GAP = 44


def bench_ports(offset: int) -> Ports:
    return Ports(**{f.name: getattr(BENCH_PORTS, f.name) + offset for f in dataclasses.fields(Ports)})


def serve(root: Path, offset: int, servers_only: bool = False) -> int:
    """The child: ``make up``'s DevRunner on the bench ports, in the foreground until SIGTERM."""
    ports = bench_ports(offset)
    metrics = range(ports.api + METRICS_PORT_GAP, ports.api + METRICS_PORT_GAP + 16)
    # The process table of `make up`; only where analytics keeps its data and serves its endpoint moves,
    # so that this stack never meets the dev stack's.
    os.environ["SUNDIAL_ANALYTICS_CHDB_PATH"] = str(root / "analytics" / "chdb")
    os.environ["SUNDIAL_ANALYTICS_PORT"] = str(ports.api + ANALYTICS_PORT_GAP)
    os.environ["SUNDIAL_ANALYTICS_URL"] = f"http://127.0.0.1:{ports.api + ANALYTICS_PORT_GAP}"
    processes = () if servers_only else default_processes(ports.api, metrics)
    runner = DevRunner(DevLayout(root), ports=ports, processes=processes, announce=lambda _text: None)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return runner.run(stop)


def _pss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


class Sampler:
    """CPU ticks and PSS per named process (a name owns its whole subtree but the others named in it)."""

    def __init__(self, roots: dict[int, str]) -> None:
        self.roots = roots

    def usage(self) -> dict[str, machine.Usage]:
        return machine.usage_of_trees(self.roots)

    def pss_mib(self) -> dict[str, float]:
        parents, _ = machine.proc_table()
        total: dict[str, int] = dict.fromkeys(self.roots.values(), 0)
        for pid in parents:
            if (name := machine.owner(pid, parents, self.roots)) is not None:
                total[name] += _pss_kib(pid)
        return {name: round(kib / 1024, 1) for name, kib in total.items()}


def _roots(root: Path, ports: Ports, supervisor_pid: int, servers_only: bool = False) -> dict[int, str]:
    roots = {supervisor_pid: "supervisor"}
    for server, pid in LocalStack(root, ports, prometheus=True).status():
        if pid:
            roots[pid] = server.name
    for spec in () if servers_only else default_processes():
        if (pid := read_pid_file(root / "run" / f"{spec.name}.pid")) is not None:
            roots[pid] = spec.name
    return roots


def measure(root: Path, offset: int, settle: float, seconds: float, servers_only: bool = False) -> dict[str, Any]:
    ports = bench_ports(offset)
    LocalStack(root, ports, prometheus=True).stop()  # whatever a killed run left
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with open(root / "supervisor.out", "ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.workloads.idle", "--serve", "--root", str(root), "--port-offset", str(offset)]
            + (["--servers-only"] if servers_only else []),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        if servers_only:  # the setup's last step (the admin token) is written once the servers are up and migrated
            if not wait_for(lambda: DevLayout(root).admin_token.exists(), timeout=180):
                raise RuntimeError(f"the idle stack's servers were not set up; see {root}/logs")
        else:
            ready = f"http://127.0.0.1:{ports.api}/readyz"
            if not wait_for(lambda: readyz_ok(ready), timeout=180):
                raise RuntimeError(f"the idle stack's API is not ready; see {root}/logs")
            # The demo worker consumes its pool's topic; the staging one serves replays only (no consumer).
            for name, marker in (("worker", "partitions assigned"), ("worker-staging", "serving")):
                log = root / "logs" / f"{name}.log"
                if not wait_for(functools.partial(log_mentions, log, marker), timeout=90):
                    raise RuntimeError(f"{name} did not start (no {marker!r} in its log); see {log}")
        time.sleep(settle)
        sampler = Sampler(_roots(root, ports, child.pid, servers_only))
        expected = () if servers_only else default_processes()
        missing = {spec.name for spec in expected} - set(sampler.roots.values())
        if missing:
            raise RuntimeError(f"not running after the settle time: {sorted(missing)}; see {root}/logs")
        before, started = sampler.usage(), time.monotonic()
        time.sleep(seconds)
        after, elapsed = sampler.usage(), time.monotonic() - started
        restarted = _roots(root, ports, child.pid, servers_only) != sampler.roots
        hz = os.sysconf("SC_CLK_TCK")
        used = {name: after[name] - before[name] for name in before}
        cores = {name: round(u.ticks / hz / elapsed, 4) for name, u in used.items()}
        # The kernel's share of each (stime), and the context switches a second of each process's live threads.
        cores_sys = {name: round(u.system / hz / elapsed, 4) for name, u in used.items()}
        switches = {n: [round(u.voluntary / elapsed, 1), round(u.involuntary / elapsed, 1)] for n, u in used.items()}
        memory = sampler.pss_mib()
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=90)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        LocalStack(root, ports, prometheus=True).stop()
    return {
        "seconds": round(elapsed, 1),
        "settle_s": settle,
        "total_cores": round(sum(cores.values()), 4),
        "cores": dict(sorted(cores.items(), key=lambda kv: -kv[1])),
        "total_cores_sys": round(sum(cores_sys.values()), 4),
        "cores_sys": dict(sorted(cores_sys.items(), key=lambda kv: -kv[1])),
        "context_switches_per_s": dict(sorted(switches.items(), key=lambda kv: -sum(kv[1]))),
        "context_switches_per_s_total": [
            round(sum(v for v, _ in switches.values()), 1),
            round(sum(i for _, i in switches.values()), 1),
        ],
        "memory_pss_mib": memory,
        "memory_total_mib": round(sum(memory.values()), 1),
        "restarted_during_measurement": restarted,
        "loadavg": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workloads.idle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="Length of the measurement.")
    parser.add_argument("--settle", type=float, default=30.0, help="Seconds to wait after start-up before it.")
    parser.add_argument("--port-offset", type=int, default=0, help="Added to the bench ports (BENCH_PORTS).")
    parser.add_argument("--root", type=Path, default=REPO / ".sundial" / "bench-idle", help="State directory.")
    parser.add_argument(
        "--servers-only", action="store_true", help="The floor: the servers alone, set up, no Sundial process."
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="Directory of the <workload>.jsonl files.")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child that runs the stack
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.root.resolve(), args.port_offset, args.servers_only)
    line = measure(args.root.resolve(), args.port_offset, args.settle, args.seconds, args.servers_only)
    workload = "idle-floor" if args.servers_only else "idle"
    results.record(workload, line, {"settle_s": line.pop("settle_s")}, results=args.results, cpu_probe=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
