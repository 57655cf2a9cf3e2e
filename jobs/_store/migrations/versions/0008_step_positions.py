"""0008, 2026-12-02: step positions: where each recorded step stands in its handler's sequence of calls (after 0007)."""

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"


def upgrade() -> None:
    with op.batch_alter_table("job_steps") as batch:
        batch.add_column(sa.Column("position", sa.Integer(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("waiting_position", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("waiting_position")
    with op.batch_alter_table("job_steps") as batch:
        batch.drop_column("position")
