"""Markdown helpers shared by the generators."""

from __future__ import annotations

import re

_CODE = re.compile(r"(`[^`]*`)")


def cell(text: str) -> str:
    """``text`` as one Markdown table cell: one line, pipes escaped, angle brackets outside code escaped."""
    parts = _CODE.split(" ".join(str(text).split()))
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = part.replace("<", "&lt;").replace(">", "&gt;")
        out.append(part.replace("|", "\\|"))
    return "".join(out)


def prose(text: str) -> str:
    """A description as a Markdown paragraph (angle brackets outside code escaped)."""
    parts = _CODE.split(str(text).strip())
    return "".join(p.replace("<", "&lt;").replace(">", "&gt;") if i % 2 == 0 else p for i, p in enumerate(parts))
