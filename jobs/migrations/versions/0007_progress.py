"""progress: a long job's latest ctx.progress on its row, and the progress at each step's end

Revision ID: 0007_progress
Revises: 0006
Create Date: 2026-12-02 14:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_progress"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("progress", sa.JSON(), nullable=True))
    with op.batch_alter_table("job_steps") as batch:
        batch.add_column(sa.Column("progress", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_steps") as batch:
        batch.drop_column("progress")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("progress")
