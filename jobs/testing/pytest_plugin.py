"""The pytest plugin (registered by installing the package): a ``jobs_isolated`` fixture.

Use it in your own tests::

    def test_order_is_checked(jobs_isolated, client):
        client.post("/orders", json={...})
        jobs.testing.drain()              # run what was queued, in this process
        assert jobs.get(job_id).state is jobs.State.COMPLETED

Each test then gets a fresh jobs data folder and, unless a framework integration puts the
job tables in the framework's own (test) database, its own SQLite file; no doorbell is
rung (run jobs with :func:`jobs.testing.drain` or :func:`jobs.testing.perform_job`); and
the process's runtime object and settings are rebuilt before and after the test, so no
engine, doorbell or setting leaks from one test into the next. ``JOBS_*`` environment
variables are unset for the test (and restored afterwards).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.application import default_app


@pytest.fixture
def jobs_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated jobs world for one test; yields its data folder."""
    for key in list(os.environ):
        if key.startswith("JOBS_") and not key.startswith("JOBS_TEST_"):
            monkeypatch.delenv(key)
    data_dir = tmp_path / "jobs-data"
    monkeypatch.setenv("JOBS_DATA_DIR", str(data_dir))
    app = default_app()
    app.reset_settings()
    app.reset()
    app.use_doorbell(None)
    yield data_dir
    app.set_settings(None)
    app.reset()
    app.registry.reset_imports()
