"""``python -m docs_gen`` writes the reference pages; ``--check`` exits 1 if one on disk is stale."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def pages() -> dict[str, Callable[[], str]]:
    from docs_gen import cli, essay, http_api, metrics_page, migrations_page, performance, settings_page

    return {
        "reference/http-api.md": http_api.render,
        "reference/worker-protocol.md": http_api.render_gateway,
        "reference/cli.md": cli.render,
        "reference/configuration.md": settings_page.render,
        "reference/metrics.md": metrics_page.render,
        "architecture/leadership.md": essay.render,
        "performance.md": lambda: performance.render(),
        "operations/upgrades.md": lambda: migrations_page.render(),
    }


def generate() -> dict[str, str]:
    """Every page's text, generated as on a machine with no ``SUNDIAL_*`` variable set."""
    for name in [n for n in os.environ if n.startswith("SUNDIAL_")]:
        del os.environ[name]
    os.environ["COLUMNS"] = "100"
    return {name: render() for name, render in pages().items()}


def stale(texts: dict[str, str], directory: Path = DOCS) -> list[str]:
    """The pages whose file under ``directory`` differs from ``texts`` (or is missing)."""
    return [
        name
        for name, text in texts.items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs_gen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from the code")
    args = parser.parse_args(argv)
    texts = generate()
    if args.check:
        out_of_date = stale(texts)
        for name in out_of_date:
            print(f"docs/{name} is stale: run `make docs-reference`", file=sys.stderr)
        return 1 if out_of_date else 0
    for name, text in texts.items():
        (DOCS / name).parent.mkdir(parents=True, exist_ok=True)
        (DOCS / name).write_text(text)
        print(f"wrote docs/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
