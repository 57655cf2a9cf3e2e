"""0009, 2026-12-02: pauses (a kind or a queue whose jobs no claim takes until it is resumed) and the deduplication key of a submit's unique_for/debounce (after 0008)."""

import sqlalchemy as sa
from alembic import op

from jobs._store.clock import UtcDateTime

revision: str = "0009"
down_revision: str | None = "0008"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("dedup_key", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("dedup_until", UtcDateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_dedup_key", "jobs", ["dedup_key"], unique=True)
    op.create_table(
        "job_pauses",
        sa.Column("scope", sa.String(length=10), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("default_queue", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("paused_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("paused_by", sa.String(length=200), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint("scope IN ('kind', 'queue')", name=op.f("ck_job_pauses_scope")),
        sa.PrimaryKeyConstraint("scope", "name", name=op.f("pk_job_pauses")),
    )


def downgrade() -> None:
    op.drop_table("job_pauses")
    op.drop_index("ix_jobs_dedup_key", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("dedup_until")
        batch.drop_column("dedup_key")
