"""0013, 2026-12-03: global rate limits, a kind's rate_limit and rate_limit_per_key and the
job_rate_starts table the claim spaces starts with (after 0012)."""

import sqlalchemy as sa
from alembic import op

from jobs._store.clock import UtcDateTime
from jobs._store.schema_floor import record_oldest_code

revision: str = "0013"
down_revision: str | None = "0012"

#: Only added (two nullable limits columns, a new table): 0006's code still runs against it
#: (its claims do not know rate limits: a rolling upgrade enforces them once every worker
#: runs this release).
OLDEST_CODE = "0006"


def upgrade() -> None:
    with op.batch_alter_table("job_kind_limits") as batch:
        batch.add_column(sa.Column("rate_limit", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("rate_limit_per_key", sa.String(length=32), nullable=True))
    op.create_table(
        "job_rate_starts",
        sa.Column("kind", sa.String(length=200), primary_key=True),
        sa.Column("rate_key", sa.String(length=200), primary_key=True),
        sa.Column("next_at", UtcDateTime(), nullable=False),
        sa.Column("waited_for", UtcDateTime(), nullable=True),
    )
    record_oldest_code(OLDEST_CODE)


def downgrade() -> None:
    op.drop_table("job_rate_starts")
    with op.batch_alter_table("job_kind_limits") as batch:
        batch.drop_column("rate_limit_per_key")
        batch.drop_column("rate_limit")
