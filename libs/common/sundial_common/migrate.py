"""Schema migrations, run by Alembic over plain-SQL revisions in ``migrations/versions``.

``sundial migrate`` (and :func:`upgrade`) bring a database to the newest revision; running it on a
current database is a no-op, so every deploy can run it first.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

from sundial_common.settings import CommonSettings

_HERE = Path(__file__).parent


def _config(dsn: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_HERE / "migrations"))
    # Alembic speaks SQLAlchemy URLs; services speak plain asyncpg DSNs.
    url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1).replace("postgres://", "postgresql+asyncpg://", 1)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


async def upgrade(dsn: str, revision: str = "head") -> None:
    """Apply every pending migration. Alembic runs its own event loop, so it gets a thread."""
    await asyncio.to_thread(command.upgrade, _config(dsn), revision)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sundial migrate", description="Apply database migrations (idempotent; safe on every deploy)."
    )
    parser.add_argument("--database-url", default=None, help="Postgres DSN (env SUNDIAL_DATABASE_URL).")
    parser.add_argument("--revision", default="head", help="Target revision (default: head).")
    args = parser.parse_args(argv)
    dsn = args.database_url or CommonSettings().database_url
    command.upgrade(_config(dsn), args.revision)
    print(f"schema at {args.revision}")
    return 0
