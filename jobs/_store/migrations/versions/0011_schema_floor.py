"""0011, 2026-12-02: the oldest code a schema serves, for rolling upgrades (after 0010)."""

import sqlalchemy as sa
from alembic import op

from jobs._store.schema_floor import record_oldest_code

revision: str = "0011"
down_revision: str | None = "0010"

#: The oldest code that runs against the schema with this migration in: every migration
#: since 0006 only added (nullable columns, tables, indexes), so 0006's code writes and
#: reads its rows as it always did.
OLDEST_CODE = "0006"


def upgrade() -> None:
    op.create_table(
        "job_schema_floor",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("oldest_code", sa.String(length=32), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_job_schema_floor_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_schema_floor")),
    )
    record_oldest_code(OLDEST_CODE)


def downgrade() -> None:
    op.drop_table("job_schema_floor")
