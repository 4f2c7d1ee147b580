"""The code blocks of the documentation: which pages have them, and whether each runs under test.

A fenced block in one of :data:`LANGUAGES` runs under ``tests/docs`` unless the line before it is
``<!-- not-run: <reason> -->``. A page's runnable shell blocks run in order as one script (a later block uses the
variables an earlier one set); a Python block whose first line is ``# <name>.py`` is written to that file in the
sandbox (a module a later block imports or runs) and imported there; any other Python block is run as a script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import REPO_ROOT

LANGUAGES = {"bash", "sh", "shell", "python"}
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<reason>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, for a block that is not run

    @property
    def shell(self) -> bool:
        return self.lang in ("bash", "sh", "shell")

    @property
    def module_file(self) -> str | None:
        first = self.code.splitlines()[0].strip() if self.code.strip() else ""
        match = re.fullmatch(r"#\s*(\w+\.py)", first)
        return match.group(1) if self.lang == "python" and match else None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README and every hand-written page of the site (the generated reference pages have no examples)."""
    docs = sorted(p for p in (REPO_ROOT / "docs").rglob("*.md") if "reference" not in p.relative_to(REPO_ROOT).parts)
    return [REPO_ROOT / "README.md", *docs]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match or not match.group("lang"):
            i += 1
            continue
        start, lang, indent = i, match.group("lang"), match.group("indent")
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(line[len(indent) :] for line in lines[start + 1 : j]) + "\n"
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        reason = _NOT_RUN.match(before)
        if lang in LANGUAGES:
            found.append(
                Block(
                    str(path.relative_to(REPO_ROOT)), start + 1, lang, code, reason.group("reason") if reason else None
                )
            )
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in blocks(path)]
