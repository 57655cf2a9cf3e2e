"""0001, 2026-11-29: initial job tables (after nothing)."""

import sqlalchemy as sa
from alembic import op

import jobs._store.clock

revision: str = "0001"
down_revision: str | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("previous_state", sa.String(length=20), nullable=True),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("lease_until", jobs._store.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("liveness_key", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("run_after", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("dispatched_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("code_version", sa.String(length=200), nullable=True),
        sa.Column("waiting_for", sa.String(length=200), nullable=True),
        sa.Column("created_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("finished_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "previous_state IS NULL OR previous_state IN ('QUEUED', 'RUNNING', 'WAITING_APPROVAL', 'COMPLETED', 'FAILED', 'CANCELLED')",
            name=op.f("ck_jobs_previous_state"),
        ),
        sa.CheckConstraint(
            "state IN ('QUEUED', 'RUNNING', 'WAITING_APPROVAL', 'COMPLETED', 'FAILED', 'CANCELLED')",
            name=op.f("ck_jobs_state"),
        ),
        sa.CheckConstraint("attempts >= 0 AND max_attempts >= 1", name=op.f("ck_jobs_attempts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_kind"), ["kind"], unique=False)
        batch_op.create_index("ix_jobs_state_lease_until", ["state", "lease_until"], unique=False)
        batch_op.create_index("ix_jobs_state_run_after", ["state", "run_after"], unique=False)

    op.create_table(
        "job_steps",
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("recorded_at", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_steps_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "name", name=op.f("pk_job_steps")),
    )
    op.create_table(
        "job_transitions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("from_state", sa.String(length=20), nullable=True),
        sa.Column("to_state", sa.String(length=20), nullable=False),
        sa.Column("at", jobs._store.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("approved_by", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_transitions_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_transitions")),
    )
    with op.batch_alter_table("job_transitions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_transitions_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_transitions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_transitions_job_id"))

    op.drop_table("job_transitions")
    op.drop_table("job_steps")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_state_run_after")
        batch_op.drop_index("ix_jobs_state_lease_until")
        batch_op.drop_index(batch_op.f("ix_jobs_kind"))

    op.drop_table("jobs")
