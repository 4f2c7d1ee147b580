"""``sundial keys``: the master key that wraps tenants' data keys — check it, rotate it.

``sundial keys check`` says whether this process's master key (``SUNDIAL_MASTER_KEY`` /
``SUNDIAL_MASTER_KEY_FILE``) is the one the database's data keys are wrapped by, with both check values.

``sundial keys rotate --new-key-file PATH`` re-wraps every tenant's data key under a new master key, in
batches, printing its progress; the data keys themselves do not change, so everything sealed before the
rotation (jobs, results, stored responses, messages retained in Kafka) still opens after it. It runs against
the database directly, never over HTTP (the master keys must not travel). It is resumable: run it again with
the same two keys after an interruption and it carries on. Running processes keep working throughout (they
hold their unwrapped data keys); once it has finished, start processes with the new key — a process
started with the old one is refused. Retries are safe: a re-run after success reports nothing left to do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from sundial_common.runtime.settings import CommonSettings, SettingsHelpParser, load_settings
from sundial_common.security.encryption import (
    KeyProvider,
    LocalMasterKey,
    MasterKeyError,
    master_key_provider,
    parse_master_key,
)

_FIELDS = ("database_url", "env", "master_key", "master_key_file", "dev_root")
BATCH = 500


def _parser() -> argparse.ArgumentParser:
    parser = SettingsHelpParser(
        settings=CommonSettings,
        fields=_FIELDS,
        prog="sundial keys",
        description="Check or rotate the master key that wraps tenants' data keys (directly against Postgres).",
        epilog="exit codes: 0 done, 1 refused (wrong key, another rotation under way), 2 usage.",
    )
    parser.add_argument("--database-url", default=None, help="Postgres DSN (env SUNDIAL_DATABASE_URL).")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{check,rotate}", parser_class=argparse.ArgumentParser
    )
    commands.add_parser(
        "check",
        help="Is the current master key the database's? Prints both check values.",
        description="Compare the current master key (SUNDIAL_MASTER_KEY / SUNDIAL_MASTER_KEY_FILE) with the "
        "database's record of the key that wraps its data keys.",
    )
    rotate = commands.add_parser(
        "rotate",
        help="Re-wrap every data key under a new master key (resumable; jobs keep running).",
        description="Re-wrap every tenant's data key, now wrapped by the current master key "
        "(SUNDIAL_MASTER_KEY / SUNDIAL_MASTER_KEY_FILE), under the new one. Afterwards, start every process "
        "with the new key. Run it again with the same keys to resume an interrupted rotation.",
    )
    new = rotate.add_mutually_exclusive_group(required=True)
    new.add_argument("--new-key-file", type=Path, help="File holding the new master key (32 bytes, base64 or hex).")
    new.add_argument(
        "--new-key-env", metavar="VAR", help="Environment variable holding the new master key (kept off argv)."
    )
    rotate.add_argument("--batch", type=int, default=BATCH, help=f"Data keys per statement (default {BATCH}).")
    rotate.add_argument("--quiet", action="store_true", help="No progress lines, only the summary.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Check or rotate the master key that wraps tenants' data keys."""
    parser = _parser()
    args = parser.parse_args(argv)
    settings = load_settings(CommonSettings, parser, database_url=args.database_url)
    try:
        current = master_key_provider(settings)
        if args.command == "check":
            return asyncio.run(_check(settings.database_url, current))
        if args.new_key_file is not None:
            try:
                text = args.new_key_file.read_text()
            except OSError as exc:
                parser.error(f"cannot read --new-key-file {args.new_key_file}: {exc.strerror}")
        else:
            text = os.environ.get(args.new_key_env, "")
            if not text:
                parser.error(f"--new-key-env: ${args.new_key_env} is not set")
        new = LocalMasterKey(parse_master_key(text))
        if args.batch < 1:
            parser.error("--batch must be at least 1")
        return asyncio.run(rotate(settings.database_url, current, new, batch=args.batch, quiet=args.quiet))
    except MasterKeyError as exc:
        print(f"sundial keys: {exc}", file=sys.stderr)
        return 1


async def _check(dsn: str, current: KeyProvider) -> int:
    from sundial_common.stores import Stores  # imported late: --help needs no database driver

    stores = await Stores.connect(dsn, min_size=1, max_size=1)
    try:
        recorded, rotating_to = await stores.keys.master_check_values()
    finally:
        await stores.close()
    print(f"this master key:     {current.check_value}")
    print(f"database's key:      {recorded or '(none recorded yet: the first process records its key)'}")
    if rotating_to:
        print(f"rotation under way:  to {rotating_to}")
    ok = recorded is None or current.check_value in (recorded, rotating_to)
    print("match" if ok else "MISMATCH: processes with this key are refused at start")
    return 0 if ok else 1


async def rotate(dsn: str, current: KeyProvider, new: KeyProvider, *, batch: int = BATCH, quiet: bool = False) -> int:
    """Re-wrap every data key from ``current`` to ``new``; 0 when done (or nothing to do)."""
    from sundial_common.stores import Stores

    old, target = current.check_value, new.check_value
    stores = await Stores.connect(dsn, min_size=1, max_size=1)
    try:
        keys = stores.keys
        recorded, rotating_to = await keys.master_check_values()
        if recorded == target and rotating_to is None:
            print(f"nothing to do: the data keys are already wrapped by {target}")
            return 0
        if recorded is None:
            await keys.record_master_check_value(old)
        if target == old:
            raise MasterKeyError("the new master key is the current one")
        if not await keys.begin_rotation(old, target):
            raise MasterKeyError(
                f"cannot rotate from {old}: the database's key is {recorded}"
                + (f", rotating to {rotating_to}" if rotating_to else "")
                + " (the current SUNDIAL_MASTER_KEY must be the database's key; an interrupted rotation resumes "
                "only with the same new key)"
            )
        left, total = await keys.count_data_keys(old)
        done = total - left
        if not quiet:
            print(f"rotating {left} of {total} data keys from {old} to {target}", flush=True)
        while True:
            rows = await keys.data_keys_to_rewrap(old, batch)
            if not rows:
                break
            rewrapped = [
                (tenant, await new.wrap(await current.unwrap(wrapped, tenant), tenant)) for tenant, wrapped in rows
            ]
            done += await keys.rewrap_data_keys(rewrapped, old, target)
            if not quiet:
                print(f"  {done}/{total} re-wrapped", flush=True)
        if not await keys.finish_rotation(old, target):
            raise MasterKeyError("data keys under the old master key appeared during the rotation; run it again")
        print(f"rotated: {total} data keys now wrapped by {target}; start processes with the new master key")
        return 0
    finally:
        await stores.close()
