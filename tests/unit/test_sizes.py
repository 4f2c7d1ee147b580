"""No production module over 600 lines and no production class over 300: a module owns one thing, a class one
thing you can name. The figures are lines of source, docstrings and comments included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("libs", "services", "infra", "bench", "docs_gen")
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300


def _modules() -> list[Path]:
    return [path for package in PRODUCTION for path in sorted((ROOT / package).rglob("*.py"))]


def test_no_production_module_is_over_600_lines() -> None:
    long = {}
    for path in _modules():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            long[str(path.relative_to(ROOT))] = lines
    assert long == {}


def test_no_production_class_is_over_300_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert long == {}
