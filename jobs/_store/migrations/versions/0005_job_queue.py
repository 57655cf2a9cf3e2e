"""0005, 2026-12-01: job queue (after 0004)."""

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"


def upgrade() -> None:
    # NULL is JOBS_QUEUE: existing jobs keep going where they went.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("queue", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("queue")
