"""0007, 2026-12-02: progress: a long job's latest ctx.progress on its row, and the progress at each step's end (after 0006)."""

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"


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
