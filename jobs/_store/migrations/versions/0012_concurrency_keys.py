"""0012, 2026-12-02: concurrency keys, a job's key and its kind's max_running_per_key (after 0011)."""

import sqlalchemy as sa
from alembic import op

from jobs._store.schema_floor import record_oldest_code

revision: str = "0012"
down_revision: str | None = "0011"

#: Only added (a nullable column and its index, a nullable limits column): 0006's code still
#: runs against it (its claims do not know per-key limits: a rolling upgrade enforces them
#: once every worker runs this release).
OLDEST_CODE = "0006"


def upgrade() -> None:
    # NULL: no key (every job before this revision); the per-key limit does not hold it.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("concurrency_key", sa.String(length=200), nullable=True))
    # Of the rows with a key only: a job without one pays nothing for the index.
    op.create_index(
        "ix_jobs_concurrency_key_kind_state",
        "jobs",
        ["concurrency_key", "kind", "state"],
        postgresql_where=sa.text("concurrency_key IS NOT NULL"),
        sqlite_where=sa.text("concurrency_key IS NOT NULL"),
    )
    with op.batch_alter_table("job_kind_limits") as batch:
        batch.add_column(sa.Column("max_running_per_key", sa.Integer(), nullable=True))
        batch.create_check_constraint(
            "max_running_per_key",
            "max_running_per_key IS NULL OR max_running_per_key >= 0",
        )
    record_oldest_code(OLDEST_CODE)


def downgrade() -> None:
    with op.batch_alter_table("job_kind_limits") as batch:
        batch.drop_constraint("max_running_per_key", type_="check")
        batch.drop_column("max_running_per_key")
    op.drop_index("ix_jobs_concurrency_key_kind_state", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("concurrency_key")
