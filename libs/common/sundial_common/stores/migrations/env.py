"""Alembic environment: runs Sundial's migrations over asyncpg.

Migrations are plain SQL (``op.execute``): the schema is owned by SQL, not by an ORM model.
The DSN comes from the Alembic config (set by ``sundial_common.commands.migrate``), never from a file.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


async def _main() -> None:
    engine = create_async_engine(config.get_main_option("sqlalchemy.url") or "")
    async with engine.connect() as connection:
        await connection.run_sync(_run)
        await connection.commit()
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `sundial migrate` against a database")
asyncio.run(_main())
