"""0006, 2026-12-02: workflows: parent and children, parked jobs, events with deadlines (after 0005)."""

import sqlalchemy as sa
from alembic import op

from jobs._store.clock import UtcDateTime

revision: str = "0006"
down_revision: str | None = "0005"

_BEFORE = "'QUEUED', 'RUNNING', 'WAITING_APPROVAL', 'COMPLETED', 'FAILED', 'CANCELLED'"
_AFTER = "'QUEUED', 'RUNNING', 'WAITING_APPROVAL', 'WAITING', 'COMPLETED', 'FAILED', 'CANCELLED'"


def _states(batch: object, states: str) -> None:
    batch.drop_constraint(op.f("ck_jobs_state"), type_="check")  # type: ignore[attr-defined]
    batch.drop_constraint(op.f("ck_jobs_previous_state"), type_="check")  # type: ignore[attr-defined]
    batch.create_check_constraint("state", f"state IN ({states})")  # type: ignore[attr-defined]
    batch.create_check_constraint(  # type: ignore[attr-defined]
        "previous_state", f"previous_state IS NULL OR previous_state IN ({states})"
    )


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("parent_id", sa.String(length=200), nullable=True))
        batch.add_column(
            sa.Column("children_pending", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("awaited", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("wait_event", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("wait_deadline", UtcDateTime(timezone=True), nullable=True))
        batch.create_index("ix_jobs_parent_id", ["parent_id"])
        batch.create_index("ix_jobs_state_wait_deadline", ["state", "wait_deadline"])
        batch.create_check_constraint("children_pending", "children_pending >= 0")
        _states(batch, _AFTER)
    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("sent_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("consumed_at", UtcDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_job_events_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id_name", "job_events", ["job_id", "name"])


def downgrade() -> None:
    op.drop_index("ix_job_events_job_id_name", table_name="job_events")
    op.drop_table("job_events")
    with op.batch_alter_table("jobs") as batch:
        _states(batch, _BEFORE)
        batch.drop_constraint(op.f("ck_jobs_children_pending"), type_="check")
        batch.drop_index("ix_jobs_state_wait_deadline")
        batch.drop_index("ix_jobs_parent_id")
        batch.drop_column("wait_deadline")
        batch.drop_column("wait_event")
        batch.drop_column("awaited")
        batch.drop_column("children_pending")
        batch.drop_column("parent_id")
