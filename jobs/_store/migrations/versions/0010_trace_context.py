"""0010, 2026-12-02: the trace context a job was submitted in (after 0009)."""

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"


def upgrade() -> None:
    # NULL: submitted without tracing (or before this revision); its runs start new traces.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("trace_context", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("trace_context")
