"""Which schemas this code may run on, checked when a process opens its stores.

Migrations are expand-only within a release (new tables, new nullable or defaulted columns, new indexes —
never a drop, a rename or a changed meaning), so the previous release's processes keep running on the new
schema while the fleet rolls. A migration that must break that rule records itself in
``schema_compatibility.runs_with_code_from``; :func:`check_compatible` (run by ``Stores.connect``) makes a
process that does not know that revision refuse to start with :class:`SchemaTooNew`. This module imports no
Alembic: every process runs it at start.
"""

from __future__ import annotations

import functools
from pathlib import Path

import asyncpg

_VERSIONS = Path(__file__).parent / "migrations" / "versions"


class SchemaTooNew(SystemExit):
    """The database was migrated by a release whose schema this process cannot run on.

    A ``SystemExit``: the process stops with this one line, not a traceback."""


@functools.cache
def known_revisions() -> frozenset[str]:
    """The revisions of the migrations this code carries (``NNNN`` of ``versions/NNNN_name.py``)."""
    return frozenset(path.name.split("_", 1)[0] for path in _VERSIONS.glob("[0-9]*_*.py"))


async def check_compatible(connection: asyncpg.Connection) -> None:
    """Raise :class:`SchemaTooNew` if the schema needs a migration this code does not know."""
    try:
        needed = await connection.fetchval("SELECT runs_with_code_from FROM schema_compatibility")
    except asyncpg.UndefinedTableError:
        return  # a schema from before the table: older than this code, nothing it cannot run on
    if needed is not None and needed not in known_revisions():
        newest = max(known_revisions())
        raise SchemaTooNew(
            f"the database schema needs Sundial code that knows migration {needed}; this process knows "
            f"migrations up to {newest}. Run the release that migrated the database (or a newer one)."
        )
