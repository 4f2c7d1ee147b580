"""Sundial's benchmarks: ``python -m bench <workload> [options]`` (``make bench`` runs the standard set).

- :mod:`bench.harness` — the public harness: a stack of a chosen shape on the bench ports, jobs registered
  straight into Postgres, a dispatch run measured from registration until every job ran;
- :mod:`bench.results` — the per-workload JSON-lines files in ``bench/results/`` and their current figures;
- :mod:`bench.machine` — what a figure was measured on (and each process's CPU, read from /proc);
- :mod:`bench.registration` — jobs registered straight into Postgres (COPY), sealed and in the hot window;
- :mod:`bench.figures` — the figures of a dispatch run (lateness percentiles, stages, Postgres by client);
- :mod:`bench.profiling` — py-spy profiles of bench processes, written outside git;
- :mod:`bench.suite` — ``make bench``'s run (W1-W4, idle, ceilings, API creates on one stack shape);
- :mod:`bench.workloads` — one module per workload or tool; :mod:`bench.catalog` names them for the command line.

A benchmark measures and records; it never passes or fails on timing.
"""
