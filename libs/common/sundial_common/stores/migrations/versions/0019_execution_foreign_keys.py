"""executions and execution_attempts lose their foreign keys to tenants and jobs: three lookups per execution.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-24

Every execution paid three referential-integrity checks on the hot path: its insert looked up its tenant
and its job, its first attempt's insert its tenant again (each an after-row trigger event and a ``SELECT 1 ...
FOR KEY SHARE`` statement, planned at each call under ``plan_cache_mode = force_custom_plan``). Measured with
``pg_stat_statements.track = all`` on dispatch + start + finish rounds of 250 (bench/workloads/storage.py's rounds, 40
partitions, three runs on the loaded VM): 9–25 µs a tenant check and ~16 µs a job check with their planning,
0.035–0.065 ms of Postgres per execution before counting the
trigger queue; and every concurrent dispatch and start ``KEY SHARE``-locked the same tenant row, which makes
a multixact of its lockers.

They never caught anything: an execution's tenant and job are its job row's, copied by the statement that
inserts it (the dispatch's, a backfill's, a dependency's, under the job row's ``FOR UPDATE`` lock); an
attempt's tenant is its execution's, copied in the same statement. Neither a tenant nor a job row is ever
deleted (a deleted job is a state; a suspended tenant too), and jobs keep their own key to ``tenants``.
0018 dropped the attempts' key to executions for the same reason. ``job_triggers``, ``backfills`` and the
other low-rate tables keep theirs.

**Down**: the keys come back (validated: one scan of each table).
"""

from sundial_common.stores.schema import run_sql_script

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE executions DROP CONSTRAINT executions_tenant_id_fkey, DROP CONSTRAINT executions_job_id_fkey;
    ALTER TABLE execution_attempts DROP CONSTRAINT execution_attempts_tenant_id_fkey;
    """
    )


def downgrade() -> None:
    run_sql_script(
        """
    ALTER TABLE executions ADD CONSTRAINT executions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id),
        ADD CONSTRAINT executions_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id);
    ALTER TABLE execution_attempts
        ADD CONSTRAINT execution_attempts_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (id);
    """
    )
