"""What each fault cost: the fault tests record their recovery figures here, and ``make chaos`` prints the table.

Every fault test asserts the invariants and a generous bound; the exact figures go through :func:`record` to
``.sundial/chaos/<fault>.json`` (one file per fault, the last run wins), so a regression in recovery time is
visible even when every invariant still holds. ``python -m tests.faults.recovery`` prints them as one table.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / ".sundial" / "chaos"


@dataclass(frozen=True)
class Recovery:
    """One fault's cost, in seconds; ``None`` where the figure does not apply to the fault."""

    fault: str
    longest_dispatch_gap_s: float | None = None  # longest time no execution was published, across the fault
    longest_start_gap_s: float | None = None  # longest time no handler started in the faulted pool
    p95_lateness_s: float | None = None  # of jobs due during the fault: first handler start - scheduled time
    max_lateness_s: float | None = None
    jobs: int = 0  # jobs due during the fault, the population of the lateness figures
    note: str = ""


def record(recovery: Recovery, results: Path = RESULTS) -> Path:
    """Write one fault's figures (overwriting that fault's previous run)."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / (re.sub(r"[^a-z0-9]+", "-", recovery.fault.lower()).strip("-") + ".json")
    path.write_text(json.dumps(asdict(recovery), indent=2) + "\n")
    return path


def table(results: Path = RESULTS) -> str:
    """The recorded figures as a fixed-width table, one fault per row."""
    rows = [Recovery(**json.loads(p.read_text())) for p in sorted(results.glob("*.json"))]
    if not rows:
        return f"no recovery figures in {results}: run the fault tests (make chaos)"
    names = [f.name for f in fields(Recovery)]
    cells = [[_cell(getattr(r, n)) for n in names] for r in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


if __name__ == "__main__":
    print(table())
