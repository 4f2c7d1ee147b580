"""Every example of README and the guides either runs here, against the real stack, or says why it cannot.

The runnable blocks of each page run in order in one sandbox (see ``conftest.py``); a block that fails fails its
page, with the output. The counts of runnable and not-run blocks are printed (``pytest -s``).
"""

from __future__ import annotations

import subprocess
from collections import defaultdict

import pytest

from tests.docs.blocks import Block, all_blocks
from tests.docs.conftest import DEV_API_URL, DocsStack
from tests.support.ports import REPO_ROOT

#: A page's examples, all together (under pytest-timeout's 300 s for the test).
PAGE_TIMEOUT = 270.0
#: Pages whose run is kept as a terminal transcript (the commands as a user types them, and what they print), in
#: ``.sundial/transcripts/`` of the checkout: the five-minute path of a new user, recorded as it really runs.
TRANSCRIBED = {"docs/getting-started.md"}
TRANSCRIPTS = REPO_ROOT / ".sundial" / "transcripts"
BLOCKS = all_blocks()
RUNNABLE: dict[str, list[Block]] = defaultdict(list)
for _block in BLOCKS:
    if _block.not_run is None:
        RUNNABLE[_block.page].append(_block)


def test_every_block_runs_or_says_why_not() -> None:
    for block in BLOCKS:
        if block.not_run is not None:
            assert len(block.not_run) >= 10, f"{block.id}: give a real reason for not running it"
    runnable = sum(len(b) for b in RUNNABLE.values())
    print(f"\ndocs examples: {runnable} run under test, {len(BLOCKS) - runnable} marked not-run")
    for page, blocks in sorted(RUNNABLE.items()):
        print(f"  {page}: lines {', '.join(str(b.line) for b in blocks)}")
    assert runnable >= 5, "the README's tour at least must run"


def _run_page(docs_stack: DocsStack, blocks: list[Block]) -> None:
    script: list[str] = []
    for block in blocks:
        if block.module_file is not None:
            (docs_stack.sandbox / block.module_file).write_text(block.code)
            module = block.module_file.removesuffix(".py")
            script.append(f"# --- {block.id}: the module imports\n.venv/bin/python -c 'import {module}'\n")
            continue
        if block.shell:
            script.append(f"# --- {block.id}\n{block.code}")
            continue
        script.append(f"# --- {block.id}\n.venv/bin/python - <<'PYTHON'\n{block.code}PYTHON\n")
    if not script:
        return
    page = blocks[0].page
    try:
        result = docs_stack.run("\n".join(script), timeout=PAGE_TIMEOUT, transcript=page in TRANSCRIBED)
    except subprocess.TimeoutExpired as exc:
        out, err = (s.decode(errors="replace") if isinstance(s, bytes) else s for s in (exc.stdout, exc.stderr))
        pytest.fail(f"{blocks[0].page}: the examples did not finish in {exc.timeout}s\n{out}\n{err}")
    assert result.returncode == 0, (
        f"{blocks[0].page}: an example failed (exit {result.returncode})\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}\n"
        f"--- the last commands\n{docs_stack.trace()}"
    )
    if page in TRANSCRIBED:
        TRANSCRIPTS.mkdir(parents=True, exist_ok=True)
        recorded = TRANSCRIPTS / (page.removeprefix("docs/").replace("/", "-").removesuffix(".md") + ".txt")
        recorded.write_text(result.stdout.replace(docs_stack.api_url, DEV_API_URL))
        print(f"\n{page}: transcript in {recorded}")


@pytest.mark.parametrize("page", sorted(RUNNABLE))
def test_page_examples_run_against_the_stack(docs_stack: DocsStack, page: str) -> None:
    _run_page(docs_stack, RUNNABLE[page])
