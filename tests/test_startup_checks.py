"""Start-up refuses, in one line, what would fail every job; and what it must keep: a
URL's own session options."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from jobs.core.db import make_engine
from jobs.core.settings import from_env
from jobs.core.store import JobStore
from jobs.schema import upgrade
from tests.conftest import private_pg_database


@pytest.mark.postgres
def test_two_tenants_search_paths_stay_apart() -> None:
    """A URL's own ``options=-csearch_path=…`` was replaced by the session time-outs, so two
    tenants shared one jobs table (and each sweeper worked on the other's jobs)."""
    with private_pg_database("jobs_tenants") as base_url:
        admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE SCHEMA tenant_a; CREATE SCHEMA tenant_b"))
        engines = []
        for tenant in ("tenant_a", "tenant_b"):
            url = (
                make_url(base_url)
                .update_query_dict({"options": f"-csearch_path={tenant}"})
                .render_as_string(hide_password=False)
            )
            engine = make_engine(from_env({"JOBS_DATABASE_URL": url}).database_url)
            engines.append(engine)
            upgrade(engine)
            JobStore(engine).create("k", {}, job_id=f"job-of-{tenant}", max_attempts=1)
            with engine.connect() as conn:
                assert conn.execute(text("SHOW search_path")).scalar() == tenant
                assert conn.execute(text("SHOW statement_timeout")).scalar() == "2min"
        with admin.connect() as conn:
            for tenant in ("tenant_a", "tenant_b"):
                ids = conn.execute(text(f"SELECT id FROM {tenant}.jobs")).scalars().all()
                assert ids == [f"job-of-{tenant}"]
            assert conn.execute(text("SELECT to_regclass('public.jobs')")).scalar() is None
        for engine in engines:
            engine.dispose()
        admin.dispose()
