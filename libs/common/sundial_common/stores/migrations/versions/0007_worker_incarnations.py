"""worker_incarnations: each worker identity's current incarnation, so a restarted worker knows it restarted.

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-23

A worker that comes back (killed and restarted by its supervisor, a container restarted in place) takes
the next incarnation of its identity (``SUNDIAL_WORKER_ID``, else ``SUNDIAL_INSTANCE_ID``) before it
consumes anything. Every attempt still RUNNING under that identity then belongs to an earlier incarnation,
which is dead: the new one declares them lost at once, instead of leaving them to the sweeper, which must
wait for their liveness keys to expire and stay missing. One row per identity.
"""

from sundial_common.stores.schema import run_sql_script

revision = "0007"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        "CREATE TABLE worker_incarnations ("
        " worker_id text PRIMARY KEY,"
        " pool text NOT NULL,"
        " incarnation bigint NOT NULL,"
        " host text NOT NULL,"
        " pid integer NOT NULL,"
        " started_at timestamptz NOT NULL DEFAULT now());"
    )


def downgrade() -> None:
    run_sql_script("DROP TABLE worker_incarnations;")
