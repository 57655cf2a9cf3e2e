"""0014, 2026-12-03: fairness across keys, the job_key_turns table (when each key of a
fair kind was last served; after 0013)."""

import sqlalchemy as sa
from alembic import op

from jobs._store.clock import UtcDateTime
from jobs._store.schema_floor import record_oldest_code

revision: str = "0014"
down_revision: str | None = "0013"

#: Only added (a new table): 0006's code still runs against it (its claims do not rotate
#: across keys: a rolling upgrade is fair once every worker runs this release).
OLDEST_CODE = "0006"


def upgrade() -> None:
    op.create_table(
        "job_key_turns",
        sa.Column("kind", sa.String(length=200), primary_key=True),
        sa.Column("concurrency_key", sa.String(length=200), primary_key=True),
        sa.Column("served_at", UtcDateTime(), nullable=False),
    )
    record_oldest_code(OLDEST_CODE)


def downgrade() -> None:
    op.drop_table("job_key_turns")
