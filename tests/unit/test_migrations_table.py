"""The migrations table of the upgrades page says, per migration, whether older code runs on it and what a downgrade
undoes — read from the migrations' own docstrings and ``upgrade`` functions."""

from __future__ import annotations

from pathlib import Path

from docs_gen.migrations_page import migrations, table

EXPAND = '''"""things: a new table.

**Down**: drops the
table.
"""


def upgrade() -> None:
    run_sql_script("CREATE TABLE things (id int);")
'''
CONTRACT = '''"""Drop a column the previous release reads.

Its readers are gone.
"""


def upgrade() -> None:
    run_sql_script("ALTER TABLE jobs DROP COLUMN old; UPDATE schema_compatibility SET runs_with_code_from = '0041';")
'''


def test_each_migration_says_whether_older_code_runs_on_it_and_what_down_undoes(tmp_path: Path) -> None:
    (tmp_path / "0012_old.py").write_text('"""Before the rule."""\n')
    (tmp_path / "0040_things.py").write_text(EXPAND)
    (tmp_path / "0041_drop_old.py").write_text(CONTRACT)
    old, expand, contract = migrations(tmp_path)
    assert (old.revision, old.expand_only, old.down) == ("0012", None, None)
    assert (expand.summary, expand.expand_only, expand.down) == ("things: a new table.", True, "drops the table.")
    assert (contract.expand_only, contract.down) == (False, None)
    rows = table([old, expand, contract]).splitlines()
    assert rows[2] == "| 0012 | Before the rule. | not recorded | (not described) |"
    assert rows[3] == "| 0040 | things: a new table. | yes | drops the table. |"
    assert rows[4] == "| 0041 | Drop a column the previous release reads. | no: code from 0041 on | (not described) |"


def test_every_migration_of_this_release_describes_its_downgrade() -> None:
    assert [m.revision for m in migrations() if m.revision >= "0026" and m.down is None] == []
