"""py-spy profiles of bench processes: collapsed stacks, written where the run says (by default under
``.sundial/bench/profiles``, outside git)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def record(pid: int, output: Path, seconds: float) -> subprocess.Popen[bytes]:
    """Start py-spy on ``pid`` for ``seconds`` (at least one), writing its collapsed stacks to ``output``; the
    caller waits for it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen(
        [
            *(py_spy, "record", "--format", "raw", "--rate", "200", "--nonblocking"),
            *("--duration", str(max(1, round(seconds))), "--pid", str(pid), "--output", str(output)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
