"""step positions: where each recorded step stands in its handler's sequence of calls

Revision ID: 0006d
Revises: 0006
Create Date: 2026-12-02 14:40:00.000000

``job_steps.position`` is the call's place in the handler (0 for the first recorded call),
written by every write that records a step, so a resumed run can check that the code asks
for the same steps in the same order (``jobs.NonDeterministic``). ``jobs.waiting_position``
is the position of the wait a parked job will be recorded under (an approval, an event),
for the writer that records it. Both are nullable: steps recorded before this revision have
none, and their jobs replay by name only, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006d"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


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
