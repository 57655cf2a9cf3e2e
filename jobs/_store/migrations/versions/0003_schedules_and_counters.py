"""0003, 2026-11-30: periodic schedules and operational counters (after 0002)."""

import sqlalchemy as sa
from alembic import op

import jobs._store.clock

revision: str = "0003"
down_revision: str | None = "0002"


def upgrade() -> None:
    op.create_index(op.f("ix_jobs_finished_at"), "jobs", ["finished_at"], unique=False)
    op.create_table(
        "job_schedules",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("catch_up", sa.String(length=10), nullable=False),
        sa.Column("source", sa.String(length=10), nullable=False),
        sa.Column("last_tick", jobs._store.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("created_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("catch_up IN ('latest', 'all')", name=op.f("ck_job_schedules_catch_up")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_job_schedules")),
    )
    op.create_table(
        "job_counters",
        sa.Column("name", sa.String(length=60), nullable=False),
        sa.Column("kind", sa.String(length=200), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", "kind", name=op.f("pk_job_counters")),
    )


def downgrade() -> None:
    op.drop_table("job_counters")
    op.drop_table("job_schedules")
    op.drop_index(op.f("ix_jobs_finished_at"), table_name="jobs")
