"""0011, 2026-12-02: concurrency keys, a job's key and its kind's max_running_per_key (after 0010)."""

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"


def upgrade() -> None:
    # NULL: no key (every job before this revision); the per-key limit does not hold it.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("concurrency_key", sa.String(length=200), nullable=True))
    op.create_index(
        "ix_jobs_concurrency_key_kind_state", "jobs", ["concurrency_key", "kind", "state"]
    )
    with op.batch_alter_table("job_kind_limits") as batch:
        batch.add_column(sa.Column("max_running_per_key", sa.Integer(), nullable=True))
        batch.create_check_constraint(
            "max_running_per_key",
            "max_running_per_key IS NULL OR max_running_per_key >= 0",
        )


def downgrade() -> None:
    with op.batch_alter_table("job_kind_limits") as batch:
        batch.drop_constraint("max_running_per_key", type_="check")
        batch.drop_column("max_running_per_key")
    op.drop_index("ix_jobs_concurrency_key_kind_state", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("concurrency_key")
