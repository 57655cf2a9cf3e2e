"""A long job's progress (``ctx.progress``) with real ``celery worker`` processes, on
PostgreSQL + RabbitMQ and on the embedded setup (SQLite + the filesystem broker):

- a handler that reports progress 10,000 times in a tight loop writes the job's row a
  bounded number of times (counted by a trigger in the database, whatever executor the
  worker's store uses), and each step's record keeps the progress at its end;
- while the job runs, its progress shows in ``jobctl show``, ``jobctl explain`` (and their
  ``--json``) and the result handle's ``.info`` (Celery's custom-state meta); once it ended,
  ``.info`` is the result and the progress stays on the row;
- Flower's Jobs view renders it (list and job page, message escaped).
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, text

from jobs._core.states import State
from jobs.application import default_app
from jobs.results import JobResult
from tests.acceptance.conftest import BOTH, KINDS, PG_RABBITMQ, Stack, free_port, wait_until
from tests.conftest import jobctl_in_child

IMPORTS = f"{KINDS},jobs.examples.long_import"
ROWS = 10_000
AUTH = ("oncall", "progress-pw")


def count_progress_writes(engine: Engine) -> None:
    """A trigger that adds a row to ``progress_writes`` for every UPDATE of a job's
    ``progress`` column: the writes counted in the database itself (the worker's driver
    path on PostgreSQL never passes through SQLAlchemy's events)."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(
                text("CREATE TABLE progress_writes (id bigserial PRIMARY KEY, job_id text)")
            )
            conn.execute(
                text(
                    "CREATE FUNCTION count_progress() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN INSERT INTO progress_writes (job_id) VALUES (NEW.id); "
                    "RETURN NEW; END $$"
                )
            )
            conn.execute(
                text(
                    "CREATE TRIGGER count_progress AFTER UPDATE OF progress ON jobs "
                    "FOR EACH ROW EXECUTE FUNCTION count_progress()"
                )
            )
        else:
            conn.execute(
                text(
                    "CREATE TABLE progress_writes "
                    "(id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT)"
                )
            )
            conn.execute(
                text(
                    "CREATE TRIGGER count_progress AFTER UPDATE OF progress ON jobs "
                    "BEGIN INSERT INTO progress_writes (job_id) VALUES (NEW.id); END"
                )
            )


def progress_writes(engine: Engine, job_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM progress_writes WHERE job_id = :job"), {"job": job_id}
            ).scalar_one()
        )


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_a_tight_loop_of_progress_writes_a_bounded_number_of_rows(stack: Stack) -> None:
    stack.configure(JOBS_IMPORTS=IMPORTS)
    engine = stack.store.engine
    stack.store.reads.now()  # the embedded database exists (and is at head) from here on
    count_progress_writes(engine)
    stack.worker("w1")
    job_id = stack.submit("import_rows", {"rows": ROWS, "batches": 2, "seconds": 3.0})
    job = stack.wait_state(job_id, timeout=120)
    assert job.state is State.COMPLETED, job.last_error
    assert job.result == {"imported": ROWS}
    assert job.progress == {
        "done": ROWS,
        "total": ROWS,
        "message": f"importing: row {ROWS} of {ROWS}",
    }

    history = stack.history(job_id)
    claimed = next(move.at for move in history if move.to_state is State.RUNNING)
    ran_for = (job.finished_at - claimed).total_seconds() if job.finished_at else 0.0
    writes = progress_writes(engine, job_id)
    # At most one write a second (the first call writes at once), plus the latest value
    # at each of the 2 steps' ends and at the run's end: never one write per call.
    bound = math.ceil(ran_for) + 1 + 2 + 1
    print(f"{ROWS} ctx.progress calls in {ran_for:.1f} s: {writes} writes (bound {bound})")
    assert 2 <= writes <= bound, (writes, ran_for)
    assert writes < ROWS / 100

    # Each step's record keeps the progress at its end: the history of progress.
    steps = {step.name: step.progress for step in stack.steps(job_id)}
    assert steps == {
        "batch-0": {"done": 5000, "total": ROWS, "message": "importing: row 5000 of 10000"},
        "batch-1": {"done": ROWS, "total": ROWS, "message": "importing: row 10000 of 10000"},
    }


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_progress_shows_in_show_explain_and_info_while_the_job_runs(stack: Stack) -> None:
    stack.configure(JOBS_IMPORTS=IMPORTS)
    stack.worker("w1")
    job_id = stack.submit(
        "import_rows", {"rows": 400, "batches": 2, "seconds": 40.0, "message": "copying"}
    )
    handle: JobResult[object] = JobResult(job_id, default_app())

    def reported() -> dict[str, Any] | None:
        info = handle.info
        return info if isinstance(info, dict) and 0 < info["done"] < 400 else None

    meta = wait_until(reported, 60, "the running job's progress in .info", interval=0.2)
    assert handle.state == "STARTED"
    assert handle.job_state is State.RUNNING
    assert set(meta) == {"done", "total", "message"}
    assert meta["total"] == 400
    assert str(meta["message"]).startswith("copying: row ")

    shown = jobctl_in_child(stack.env, "show", job_id)
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("progress:")]
    assert "/400 (" in line
    assert "%): copying: row " in line

    explained = jobctl_in_child(stack.env, "explain", job_id)
    assert explained.returncode == 0, explained.stderr
    assert "is RUNNING" in explained.stdout
    assert "Progress: " in explained.stdout
    assert "/400 (" in explained.stdout

    as_json = jobctl_in_child(stack.env, "explain", job_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    progress = json.loads(as_json.stdout)["progress"]
    assert progress["total"] == 400
    assert 0 < progress["done"] <= 400

    job = stack.wait_state(job_id, timeout=150)
    assert job.state is State.COMPLETED, job.last_error
    assert handle.info == {"imported": 400}  # ended: .info is the result, as Celery's
    assert handle.progress == {"done": 400, "total": 400, "message": "copying: row 400 of 400"}
    finished = jobctl_in_child(stack.env, "show", job_id, "--json")
    record = json.loads(finished.stdout)
    assert record["progress"] == handle.progress
    assert [step["progress"]["done"] for step in record["steps"]] == [200, 400]
    after = jobctl_in_child(stack.env, "show", job_id)
    assert "progress:    400/400 (100%): copying: row 400 of 400" in after.stdout
    assert "progress 200/400 (50%): copying: row 200 of 400" in after.stdout  # batch-0's end


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_flowers_jobs_view_renders_progress(stack: Stack) -> None:
    stack.configure(JOBS_IMPORTS=IMPORTS)
    stack.worker("w1")
    hostile = "<script>alert(1)</script>"
    job_id = stack.submit(
        "import_rows", {"rows": 300, "batches": 1, "seconds": 20.0, "message": hostile}
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack.start(
        "flower",
        ["flower", f"--port={port}", "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}"],
    )

    def up() -> bool:
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"{base}/healthcheck", timeout=2).ok
        return False

    wait_until(up, 60, "Flower to start", interval=0.3)
    session = requests.Session()
    session.auth = AUTH

    def page_with_progress() -> str | None:
        page = session.get(f"{base}/jobs/job/{job_id}", timeout=30)
        assert page.status_code == 200
        return page.text if 'id="progress"' in page.text else None

    page = wait_until(page_with_progress, 60, "the job page to show progress", interval=0.3)
    assert '<progress max="1000" value="' in page
    assert "/300 (" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;: row " in page  # escaped, never HTML
    assert "<script>alert(1)" not in page
    listed = session.get(f"{base}/jobs", timeout=30)
    assert listed.status_code == 200
    assert 'class="job-progress"' in listed.text
    assert "/300 (" in listed.text
    assert "<script>alert(1)" not in listed.text
    job = stack.wait_state(job_id, timeout=90)
    assert job.state is State.COMPLETED, job.last_error
    done = session.get(f"{base}/jobs/job/{job_id}", timeout=30).text
    assert '<progress max="1000" value="1000">100%</progress>' in done
    assert 'class="step-progress">300/300 (100%)' in done  # the step record keeps it
