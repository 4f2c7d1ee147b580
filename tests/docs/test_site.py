"""The documentation site builds strictly, its generated pages match the code, and the repository speaks for itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.ports import REPO_ROOT

#: What the repository must not cite: issue numbers, work rounds, a conventions file kept elsewhere.
HISTORY = (
    r"[Ii]ssue [0-9]+|(fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth) round|[Rr]ound [0-9]+"
    r"|CONVENTIONS [0-9]"
)
CHECKED_PATHS = ("README.md", "docs", "libs", "services", "infra", "tests", "bench", "Makefile")


def _run(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )


def test_generated_pages_match_the_code() -> None:
    result = _run(sys.executable, "-m", "docs_gen", "--check")
    assert result.returncode == 0, f"a generated page is stale: run `make docs-reference`\n{result.stderr}"


def test_site_builds_strictly(tmp_path: Path) -> None:
    result = _run(sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"))
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert "fonts.googleapis.com" not in index  # the site works offline


def test_readme_is_a_front_door() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; guides belong in docs/"


def test_the_repository_cites_no_issue_round_or_outside_file() -> None:
    result = _run("git", "grep", "-nE", HISTORY, "--", *CHECKED_PATHS)
    assert result.returncode == 1 and not result.stdout, f"history in the repository:\n{result.stdout[:4000]}"
