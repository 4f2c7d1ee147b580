"""audit_log loses its primary key index: one B-tree insert per audit row, and nothing reads through it.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-26

An execution writes three or four audit rows (``dispatch``, ``start``, ``finish``; a one-shot job's
``complete``), each inserted into two B-trees: ``audit_entity_idx (entity_id, id)``, which every read of a
trail uses, and the primary key ``(id, at)`` (0020), which no statement reads: a trail is found by its entity,
paged by ``id`` within it, and retention drops whole days. Index inserts are about a third of the Postgres CPU
of the three statements that write an execution (perf on bench/workloads/storage.py's rounds: ``ExecInsertIndexTuples``
34 % of the backends' samples), so this key cost about one in eight of an execution's B-tree inserts.

The ids stay unique without it: every row takes its id from one sequence (``audit_log_id_seq``), as the
keyset paging of ``GET …/audit`` already assumes, and the log is append-only (no row is ever updated).

**Down**: the key comes back (one pass over each partition to build it).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script("ALTER TABLE audit_log DROP CONSTRAINT audit_log_pkey;")


def downgrade() -> None:
    run_sql_script("ALTER TABLE audit_log ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id, at);")
