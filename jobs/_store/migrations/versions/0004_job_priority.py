"""0004, 2026-12-01: job priority (after 0003)."""

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"


def upgrade() -> None:
    # A server default fills the existing rows; batch mode lets SQLite add the CHECK.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False)
        )
        batch.create_check_constraint("priority", "priority >= 0 AND priority <= 9")
    op.create_index(
        "ix_jobs_state_priority_run_after",
        "jobs",
        ["state", "priority", "run_after"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_state_priority_run_after", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(op.f("ck_jobs_priority"), type_="check")
        batch.drop_column("priority")
