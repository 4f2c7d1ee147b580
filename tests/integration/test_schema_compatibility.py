"""Migrations may run twice at once, and a process refuses a schema newer than it can run on."""

from __future__ import annotations

import asyncio
import os
import subprocess

import asyncpg
import pytest
from sundial_common.commands.migrate import main as migrate_main
from sundial_common.stores import Stores
from sundial_common.stores.compatibility import SchemaTooNew, known_revisions
from sundial_common.stores.schema import upgrade
from sundial_infra.supervisor import sundial_argv


async def test_two_migrations_at_once_apply_each_revision_once(blank_database: str) -> None:
    await asyncio.gather(upgrade(blank_database), upgrade(blank_database))
    connection = await asyncpg.connect(blank_database)
    try:
        assert await connection.fetchval("SELECT version_num FROM alembic_version") == max(known_revisions())
    finally:
        await connection.close()


async def test_opening_the_stores_on_a_schema_that_needs_newer_code_fails_with_a_message(database_url: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("UPDATE schema_compatibility SET runs_with_code_from = '9999'")
    finally:
        await connection.close()
    with pytest.raises(SchemaTooNew, match="knows migration 9999; this process knows migrations up to"):
        await Stores.connect(database_url)


async def test_a_process_on_a_schema_too_new_stops_with_one_line(
    database_url: str, settings_env: dict[str, str]
) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("UPDATE schema_compatibility SET runs_with_code_from = '9999'")
    finally:
        await connection.close()
    run = await asyncio.to_thread(
        subprocess.run,
        list(sundial_argv("sweeper")),
        env={**os.environ, **settings_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "needs Sundial code that knows migration 9999" in run.stderr
    assert "Traceback" not in run.stderr


async def test_waiting_for_the_schema_ends_once_it_is_migrated(
    blank_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wait = ["--database-url", blank_database, "--wait", "0"]
    assert await asyncio.to_thread(migrate_main, wait) == 1
    assert "schema not ready after 0 s: not migrated yet" in capsys.readouterr().err
    await upgrade(blank_database)
    assert await asyncio.to_thread(migrate_main, wait) == 0
