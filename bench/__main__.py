"""``python -m bench``: run ``make bench``'s workloads (:mod:`bench.suite`) or another workload or tool by name.

The first word decides: none, an option, or a workload of ``make bench``'s run (``w1``, ``create``…) runs the
suite with every argument; another name (``fairness``, ``threads``…) runs that command with the rest;
``--help`` alone lists them all (:mod:`bench.catalog`).
"""

from __future__ import annotations

import sys

from bench import catalog, suite


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"], ["help"]):
        print(catalog.usage())
        return 0
    first = args[0] if args and not args[0].startswith("-") else None
    if first is None or first in catalog.SUITE:
        return suite.main(args)
    try:
        command = catalog.command(first)
    except KeyError:
        print(f"unknown workload {first!r}\n\n{catalog.usage()}", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
