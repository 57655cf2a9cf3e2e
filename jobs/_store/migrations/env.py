"""Alembic environment: runs on the connection handed over by :mod:`jobs._store.schema`."""

from __future__ import annotations

from alembic import context

from jobs._store.tables import metadata

config = context.config
target_metadata = metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from jobs._store.db import make_engine  # noqa: PLC0415

        engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
        with engine.connect() as conn:
            _run(conn)
        engine.dispose()
        return
    _run(connection)


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode rebuilds tables
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
