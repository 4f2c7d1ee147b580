"""Named SQL queries: each store's ``.sql`` file under ``sundial_common/stores/sql``, split by ``-- name:``.

SQL lives in one file per store; a store refers to a statement by its ``-- name:``.
"""

from __future__ import annotations

import re
from importlib.resources import files

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load(text: str) -> dict[str, str]:
    """Split a file of ``-- name: x`` blocks into {name: sql}."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


def load_file(filename: str) -> dict[str, str]:
    """The named queries of one store's file, ``sundial_common/stores/sql/<filename>``."""
    return load(files("sundial_common").joinpath("stores", "sql", filename).read_text())
