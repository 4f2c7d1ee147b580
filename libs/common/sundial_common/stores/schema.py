"""The schema: Alembic over the plain-SQL revisions in ``migrations/versions``, and how a revision runs SQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command, op
from alembic.config import Config
from sqlalchemy.util import await_only

_MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(dsn: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    # Alembic speaks SQLAlchemy URLs; services speak plain asyncpg DSNs.
    url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1).replace("postgres://", "postgresql+asyncpg://", 1)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


async def upgrade(dsn: str, revision: str = "head") -> None:
    """Apply every pending migration. Alembic runs its own event loop, so it gets a thread."""
    await asyncio.to_thread(command.upgrade, alembic_config(dsn), revision)


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
