"""The schema: Alembic over the plain-SQL revisions in ``migrations/versions``, who may migrate, who may run.

**Migrating.** :func:`upgrade` brings a database to a revision under a Postgres advisory lock, so two
``sundial migrate`` runs at once (two pods of a migration Job, a retried deploy step) apply each revision
once: the second waits, then finds nothing left to do.

**Running** on a schema: :mod:`sundial_common.stores.compatibility`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
from alembic import command, op
from alembic.config import Config
from sqlalchemy.util import await_only

_MIGRATIONS = Path(__file__).parent / "migrations"
#: The advisory lock every migration run holds (the bytes of "sundial").
MIGRATION_LOCK = int.from_bytes(b"sundial", "big")


def alembic_config(dsn: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    # Alembic speaks SQLAlchemy URLs; services speak plain asyncpg DSNs.
    url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1).replace("postgres://", "postgresql+asyncpg://", 1)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


async def upgrade(dsn: str, revision: str = "head") -> None:
    """Apply every pending migration, holding :data:`MIGRATION_LOCK` on a connection of its own meanwhile.

    Alembic runs its own event loop, so it gets a thread; the lock is a session lock, released when the
    connection closes, however the upgrade ends."""
    lock = await asyncpg.connect(dsn)
    try:
        await lock.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        await asyncio.to_thread(command.upgrade, alembic_config(dsn), revision)
    finally:
        await lock.close()


def run_sql_script(sql: str) -> None:
    """Run a multi-statement SQL script inside the migration's transaction.

    SQLAlchemy's asyncpg driver prepares every statement it sends, and a prepared statement holds a single
    command ("cannot insert multiple commands into a prepared statement"), so the script goes through
    asyncpg's simple-query ``execute`` on the same connection. The ``SELECT 1`` through SQLAlchemy first
    makes the driver open the connection's transaction, so the script is part of it and commits with the
    version bump.
    """
    bind = op.get_bind()
    bind.exec_driver_sql("SELECT 1")
    await_only(bind.connection.driver_connection.execute(sql))  # type: ignore[union-attr]
