"""0002, 2026-11-29: per-kind limits (after 0001)."""

import sqlalchemy as sa
from alembic import op

import jobs._store.clock

revision: str = "0002"
down_revision: str | None = "0001"


def upgrade() -> None:
    op.create_table(
        "job_kind_limits",
        sa.Column("kind", sa.String(length=200), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("max_queued", sa.Integer(), nullable=True),
        sa.Column("updated_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "max_queued IS NULL OR max_queued >= 0", name=op.f("ck_job_kind_limits_max_queued")
        ),
        sa.CheckConstraint(
            "max_running IS NULL OR max_running >= 0", name=op.f("ck_job_kind_limits_max_running")
        ),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_job_kind_limits")),
    )


def downgrade() -> None:
    op.drop_table("job_kind_limits")
