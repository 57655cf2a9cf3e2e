"""jobs.contrib.flask through the example shop and Flask's test client, in-process (jobs
run with jobs.testing.drain), on a SQLite file shared by the app and the jobs and on
PostgreSQL: an order and its job commit or roll back together through db.session, the
doorbell rings only after the commit, a full queue answers 429 and saves nothing, the
handler runs in the app's context, the blueprint answers 202/404/409/400."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flask_sqlalchemy")

import jobs
from jobs import testing
from jobs._core.registry import REGISTRY
from jobs._core.states import State
from jobs.application import default_app
from tests.conftest import AtomicOrmSteps, peak_rss_mib


@jobs.job("relative_echo")
def relative_echo(ctx: jobs.JobContext, text: str) -> str:
    return text


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flask"
KIND = "check_flask_order"


class Shop:
    def __init__(self, app: Any, client: Any) -> None:
        self.app = app
        self.client = client
        self.rung: list[str] = []

    def orders_of(self, customer: str) -> int:
        import shop_flask  # noqa: PLC0415

        with self.app.app_context():
            return (
                shop_flask.db.session.query(shop_flask.Order).filter_by(customer=customer).count()
            )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shop(request: pytest.FixtureRequest, jobs_isolated: Path) -> Iterator[Shop]:
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import shop_flask  # noqa: PLC0415

    if request.param == "sqlite":
        url = f"sqlite:///{jobs_isolated / 'shop.sqlite3'}"
    else:
        url = request.getfixturevalue("clean_pg_web_url")
    app = shop_flask.create_app(
        {"SQLALCHEMY_DATABASE_URI": url, "TESTING": True, "SHOP_STAFF": {"erin": "s3cret"}}
    )
    try:
        with app.app_context():
            shop_flask.db.session.query(shop_flask.Order).delete()
            shop_flask.db.session.commit()
        world = Shop(app, app.test_client())
        jobs.set_doorbell(world.rung.append)
        jobs.set_limits(KIND, max_queued=None)
        yield world
    finally:
        with app.app_context():
            shop_flask.db.engine.dispose()
        REGISTRY.remove_job_scope(app.app_context)
        REGISTRY.open_steps_with(None)
        default_app().set_defaults_source(None)


def test_the_jobs_live_in_the_apps_database_unless_configured(shop: Shop) -> None:
    assert default_app().settings.database_url == shop.app.config[
        "SQLALCHEMY_DATABASE_URI"
    ].replace("postgresql://", "postgresql+psycopg://")


def test_an_order_and_its_job_commit_together_and_the_job_runs_in_the_app_context(
    shop: Shop,
) -> None:
    response = shop.client.post("/orders", json={"customer": "ada", "total_cents": 500})
    assert response.status_code == 201, response.data
    body = response.get_json()
    assert shop.orders_of("ada") == 1
    assert shop.rung == [body["job_id"]]
    assert [r.job_id for r in testing.drain()] == [body["job_id"]]
    shown = shop.client.get(f"/orders/{body['order_id']}").get_json()
    assert shown["checked"] is True  # db.session inside the handler
    assert shown["job"]["state"] == "COMPLETED"


def test_a_failed_request_leaves_no_order_no_job_and_no_doorbell(shop: Shop) -> None:
    shop.app.config["PROPAGATE_EXCEPTIONS"] = False
    response = shop.client.post(
        "/orders", json={"customer": "bob", "total_cents": 5, "fail_after_submit": True}
    )
    assert response.status_code == 500
    assert shop.orders_of("bob") == 0
    assert jobs.list_jobs(kind=KIND) == []
    assert shop.rung == []


def test_a_full_queue_answers_429_with_retry_after_and_saves_nothing(shop: Shop) -> None:
    jobs.set_limits(KIND, max_queued=0)
    response = shop.client.post("/orders", json={"customer": "cy", "total_cents": 5})
    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) >= 1
    assert shop.orders_of("cy") == 0
    assert jobs.list_jobs(kind=KIND) == []


def test_approval_through_the_app_resumes_a_waiting_job(shop: Shop) -> None:
    """The shop's approve endpoint takes only a staff token (401 without one, or with a
    wrong one, changing nothing) and records the user the token names, whatever the body's
    ``by`` says."""
    created = shop.client.post("/orders", json={"customer": "dee", "total_cents": 250_000})
    order = created.get_json()
    testing.drain()
    assert jobs.get(order["job_id"]).state is State.WAITING_APPROVAL
    approve = f"/orders/{order['order_id']}/approve"
    assert shop.client.post(approve, json={"by": "erin"}).status_code == 401
    guessed = shop.client.post(approve, json={"by": "erin"}, headers={"Authorization": "Bearer s"})
    assert guessed.status_code == 401
    assert jobs.get(order["job_id"]).state is State.WAITING_APPROVAL
    approved = shop.client.post(approve, json={"by": "mallory"}, headers=STAFF)
    assert approved.status_code == 200
    assert shop.rung[-1] == order["job_id"]
    again = shop.client.post(approve, json={"by": "erin"}, headers=STAFF)
    assert again.status_code == 409
    testing.drain()
    assert jobs.get(order["job_id"]).result == {
        "order_id": order["order_id"],
        "approved_by": "erin",
    }


STAFF = {"Authorization": "Bearer s3cret"}  # erin's token


def test_the_blueprint_submits_shows_and_approves(shop: Shop) -> None:
    created = shop.client.post(f"/jobs/{KIND}", json={"order_id": 12345}, headers=STAFF)
    assert created.status_code == 202
    job_id = created.get_json()["id"]
    assert created.headers["Location"] == f"/jobs/{job_id}"
    assert shop.rung == [job_id]
    shown = shop.client.get(created.headers["Location"], headers=STAFF).get_json()
    assert shown["state"] == "QUEUED"
    assert shop.client.get("/jobs/no-such-job", headers=STAFF).status_code == 404
    assert shop.client.post(f"/jobs/{job_id}/approve", headers=STAFF).status_code == 409
    assert shop.client.post(f"/jobs/{KIND}", json=[1], headers=STAFF).status_code == 400
    assert shop.client.post("/jobs/no_such_kind", json={}, headers=STAFF).status_code == 400
    jobs.set_limits(KIND, max_queued=1)
    refused = shop.client.post(f"/jobs/{KIND}", json={"order_id": 1}, headers=STAFF)
    assert refused.status_code == 429
    assert "Retry-After" in refused.headers


def test_the_blueprint_retries_a_cancelled_job(shop: Shop) -> None:
    """As the name ``authorize`` gives (the body's ``by`` is not asked for), and refused
    without the staff token like every endpoint."""
    job_id = shop.client.post(f"/jobs/{KIND}", json={"order_id": 7}, headers=STAFF).get_json()["id"]
    assert shop.client.post(f"/jobs/{job_id}/retry", json={}, headers=STAFF).status_code == 409
    jobs.cancel(job_id, "by mistake")
    assert shop.client.post(f"/jobs/{job_id}/retry", json={}).status_code == 403
    bad = shop.client.post(f"/jobs/{job_id}/retry", json={"from_start": "yes"}, headers=STAFF)
    assert bad.status_code == 400
    assert shop.client.post("/jobs/no-such-job/retry", json={}, headers=STAFF).status_code == 404
    retried = shop.client.post(
        f"/jobs/{job_id}/retry", json={"by": "mallory", "reason": "oops"}, headers=STAFF
    )
    assert retried.status_code == 200, retried.get_data(as_text=True)
    assert retried.get_json()["state"] == "QUEUED"
    assert shop.rung[-1] == job_id
    assert "retried by erin: oops" in (jobs.history(job_id)[-1].reason or "")


def test_a_scoped_session_rings_once_per_commit(shop: Shop) -> None:
    """db.session is a scoped_session: the submit joins this request's session, and a
    later commit of another session rings nothing more."""
    import shop_flask  # noqa: PLC0415

    with shop.app.app_context():
        first = shop.app.extensions["jobs"].submit(KIND, {"order_id": 1})
        assert shop.rung == []
        shop_flask.db.session.commit()
        assert shop.rung == [first]
    with shop.app.app_context():
        shop_flask.db.session.add(shop_flask.Order(customer="z", total_cents=1))
        shop_flask.db.session.commit()
    assert shop.rung == [first]
    with shop.app.app_context():
        rolled = shop.app.extensions["jobs"].submit(KIND, {"order_id": 2})
        shop_flask.db.session.rollback()
    with shop.app.app_context():
        shop_flask.db.session.commit()
    assert shop.rung == [first]
    with pytest.raises(jobs.UnknownJob):
        jobs.get(rolled)


# PostgreSQL only: on SQLite the second request's write would wait for the first's lock.
@pytest.mark.parametrize(
    "shop", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_another_sessions_commit_or_rollback_does_not_ring_or_drop_a_pending_doorbell(
    shop: Shop,
) -> None:
    """Two requests at once (two app contexts, two sessions of one db.session): the other
    one's commit must not ring this one's uncommitted job, nor its rollback drop it.
    (Passing the scoped_session itself used to listen on every session it makes.)"""
    import shop_flask  # noqa: PLC0415

    with shop.app.app_context():
        mine = shop.app.extensions["jobs"].submit(KIND, {"order_id": 1})
        with shop.app.app_context():
            shop_flask.db.session.add(shop_flask.Order(customer="other", total_cents=1))
            shop_flask.db.session.commit()
        assert shop.rung == []  # not rung before its own commit
        with shop.app.app_context():
            shop_flask.db.session.add(shop_flask.Order(customer="other", total_cents=1))
            shop_flask.db.session.rollback()
        shop_flask.db.session.commit()
    assert shop.rung == [mine]


def test_settings_come_from_app_config_and_the_environment_wins(
    jobs_isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flask import Flask  # noqa: PLC0415

    from jobs._core.errors import SettingsError  # noqa: PLC0415
    from jobs.application import default_app  # noqa: PLC0415
    from jobs.contrib.flask import Jobs  # noqa: PLC0415

    app = Flask("configured")
    app.config["JOBS"] = {"LEASE_SECONDS": 7, "IMPORTS": ["a", "b.c"]}
    app.config["JOBS_QUEUE"] = "shop"
    try:
        Jobs(app)
        settings = default_app().settings
        assert (settings.lease_seconds, settings.imports, settings.queue) == (
            7,
            ("a", "b.c"),
            "shop",
        )
        monkeypatch.setenv("JOBS_LEASE_SECONDS", "9")
        default_app().reset_settings()
        assert default_app().settings.lease_seconds == 9
        app.config["JOBS_LEASE_SECOND"] = 1
        default_app().reset_settings()
        with pytest.raises(SettingsError, match=r"app\.config: unknown setting 'LEASE_SECOND'"):
            default_app().settings  # noqa: B018 - reading them raises
    finally:
        REGISTRY.remove_job_scope(app.app_context)
        default_app().set_defaults_source(None)


def test_a_relative_sqlite_uri_puts_the_jobs_in_the_file_flask_sqlalchemy_uses(
    jobs_isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:///shop.db`` (Flask-SQLAlchemy's usual form) is resolved under the app's
    ``instance/`` folder: the jobs use that file, not ``shop.db`` in the working folder."""
    from flask import Flask  # noqa: PLC0415
    from flask_sqlalchemy import SQLAlchemy  # noqa: PLC0415

    from jobs.contrib.flask import Jobs  # noqa: PLC0415

    jobs_isolated.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(jobs_isolated)
    app = Flask("relative_shop", instance_path=str(jobs_isolated / "instance"))
    app.config["SQLALCHEMY_DATABASE_URI"] = "sqlite:///shop.db"
    db = SQLAlchemy()
    db.init_app(app)
    ext = Jobs(app, db)
    app.register_blueprint(ext.blueprint(insecure_no_auth=True))
    try:
        ext.create_tables()
        with app.app_context():
            engine_url = db.engine.url.render_as_string(hide_password=False)
        assert default_app().settings.database_url == engine_url
        assert (jobs_isolated / "instance" / "shop.db").exists()
        response = app.test_client().post("/jobs/relative_echo", json={"text": "hi"})
        assert response.status_code == 202, response.data
        assert not (jobs_isolated / "shop.db").exists()
    finally:
        with app.app_context():
            db.engine.dispose()
        REGISTRY.remove_job_scope(app.app_context)
        default_app().set_defaults_source(None)


def test_the_blueprint_refuses_whom_authorize_refuses_and_approves_as_whom_it_names(
    shop: Shop,
) -> None:
    """Without the staff token: 403 for every action and nothing written; an approval is
    recorded under the name the hook returns, not the body's ``by``."""
    stranger = {"Authorization": "Bearer guess"}
    assert shop.client.post(f"/jobs/{KIND}", json={"order_id": 7}).status_code == 403
    assert (
        shop.client.post(f"/jobs/{KIND}", json={"order_id": 7}, headers=stranger).status_code == 403
    )
    assert jobs.list_jobs() == []
    order = shop.client.post("/orders", json={"customer": "al", "total_cents": 500_000}).get_json()
    testing.drain()
    job_id = order["job_id"]
    assert jobs.get(job_id).state is State.WAITING_APPROVAL
    assert shop.client.get(f"/jobs/{job_id}").status_code == 403
    forged = shop.client.post(f"/jobs/{job_id}/approve", json={"by": "boss"})
    assert forged.status_code == 403
    assert jobs.get(job_id).state is State.WAITING_APPROVAL
    approved = shop.client.post(f"/jobs/{job_id}/approve", json={"by": "boss"}, headers=STAFF)
    assert approved.status_code == 200, approved.data
    testing.drain()
    assert jobs.get(job_id).result["approved_by"] == "erin"


def test_the_blueprint_needs_a_decision_about_authentication(jobs_isolated: Path) -> None:
    from flask import Flask  # noqa: PLC0415

    from jobs._core.errors import SettingsError  # noqa: PLC0415
    from jobs.contrib.flask import Jobs  # noqa: PLC0415

    app = Flask("undecided")
    ext = Jobs(app)
    try:
        with pytest.raises(SettingsError, match=r"authorize=.*insecure_no_auth=True"):
            ext.blueprint()
        with pytest.raises(SettingsError, match="exclude each other"):
            ext.blueprint(authorize=lambda *_: "x", insecure_no_auth=True)
        assert ext.blueprint(insecure_no_auth=True).name == "jobs"
    finally:
        REGISTRY.remove_job_scope(app.app_context)
        default_app().set_defaults_source(None)


TINY_APP = """
from flask import Flask
from jobs.contrib.flask import Jobs

app = Flask(__name__)
app.config["JOBS"] = {"DATABASE_URL": "sqlite:///HERE/app-jobs.sqlite3", "DATA_DIR": "HERE/data"}
Jobs(app).create_tables()
"""


def test_the_sweeper_uses_the_apps_config_and_says_when_settings_are_mixed(
    tmp_path: Path,
) -> None:
    """``JOBS_IMPORTS=tiny_app jobctl sweeper`` and ``flask --app tiny_app jobs sweeper`` sweep
    the app's database (they used to create their own empty one under jobs-data/), and say
    in one line which setting came from where when the environment adds one."""
    import subprocess  # noqa: PLC0415

    (tmp_path / "tiny_app.py").write_text(TINY_APP.replace("HERE", str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    scripts = Path(sys.executable).parent
    commands = {
        "jobctl": [str(scripts / "jobctl"), "sweeper", "--once"],
        "flask": [str(scripts / "flask"), "--app", "tiny_app", "jobs", "sweeper", "--once"],
    }
    for name, command in commands.items():
        env_here = {**env, "JOBS_LEASE_SECONDS": "12"}
        if name == "jobctl":
            env_here["JOBS_IMPORTS"] = "tiny_app"
        out = subprocess.run(
            command, check=False, cwd=tmp_path, env=env_here, capture_output=True, text=True
        )
        assert out.returncode == 0, (name, out.stderr)
        assert "dead owners re-queued: 0" in out.stdout
        assert not (tmp_path / "jobs-data").exists(), name
        assert not (tmp_path / "data" / "jobs.sqlite3").exists(), name
        said = out.stderr.strip().splitlines()
        assert said[0].startswith("settings from more than one place: "), (name, said)
        assert "JOBS_LEASE_SECONDS from the environment" in said[0]
        assert (
            "JOBS_DATABASE_URL, JOBS_DATA_DIR, JOBS_IMPORTS from tiny_app's app.config" in (said[0])
        )


CHUNKED_SERVER = """
import sys
from flask import Flask
from werkzeug.serving import make_server
from jobs.contrib.flask import Jobs

app = Flask("chunked")
app.register_blueprint(Jobs(app).blueprint(insecure_no_auth=True))
server = make_server("127.0.0.1", 0, app)
print(server.server_port, flush=True)
server.serve_forever()
"""


def send_chunked(port: int, path: str, total_bytes: int) -> bytes:
    """POST a JSON body of ``total_bytes`` in chunks, with no Content-Length; stop sending
    as soon as the server answers, and return the answer's bytes."""
    import select  # noqa: PLC0415
    import socket  # noqa: PLC0415

    chunk = b"y" * 65_536
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
        conn.sendall(head + b'7\r\n{"x": "\r\n')
        sent = 0
        while sent < total_bytes:
            readable, _, _ = select.select([conn], [], [], 0)
            if readable:
                break
            try:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        else:
            conn.sendall(b'2\r\n"}\r\n0\r\n\r\n')
        conn.shutdown(socket.SHUT_WR)  # the end of what we send: werkzeug stops draining
        while True:  # the answer, to the end (the server closes the connection)
            try:
                data = conn.recv(65_536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    return answer


def test_a_chunked_body_over_the_limit_is_refused_413_with_memory_flat(
    jobs_isolated: Path,
) -> None:
    """A real HTTP server (werkzeug's) and 300 MiB sent chunked, with no Content-Length:
    the blueprint reads at most the limit and one byte, answers 413, and the server's peak
    memory stays where it was (it grew by the whole body before)."""
    import subprocess  # noqa: PLC0415

    env = {**os.environ, "JOBS_DATA_DIR": str(jobs_isolated)}
    server = subprocess.Popen(
        [sys.executable, "-c", CHUNKED_SERVER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        before = peak_rss_mib(server.pid)
        answer = send_chunked(port, f"/jobs/{KIND}", 300 * 1024 * 1024)
        grown = peak_rss_mib(server.pid) - before
        assert answer.split(b" ")[1] == b"413", answer[:200]
        assert b"over the limit of 1048576 bytes" in answer
        assert grown < 30, f"the server grew by {grown:.0f} MiB"
    finally:
        server.kill()
        server.wait()


SHOP_SERVER = """
import sys
from werkzeug.serving import make_server
from shop_flask import app

server = make_server("127.0.0.1", 0, app)
print(server.server_port, flush=True)
server.serve_forever()
"""


def test_the_example_shops_own_endpoints_bound_a_chunked_body(jobs_isolated: Path) -> None:
    """The shop's ``POST /orders`` (its own view, not the blueprint's) on a real server: a
    chunked body past ``JOBS_MAX_INPUT_BYTES`` is refused with 413 after at most that much
    is read (``request_json``), and the server's peak memory stays where it was."""
    import subprocess  # noqa: PLC0415

    env = {
        **os.environ,
        "JOBS_DATA_DIR": str(jobs_isolated),
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), *sys.path]),
    }
    server = subprocess.Popen(
        [sys.executable, "-c", SHOP_SERVER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        before = peak_rss_mib(server.pid)
        answer = send_chunked(port, "/orders", 300 * 1024 * 1024)
        grown = peak_rss_mib(server.pid) - before
        assert answer.split(b" ")[1] == b"413", answer[:200]
        assert grown < 30, f"the shop grew by {grown:.0f} MiB"
    finally:
        server.kill()
        server.wait()


# -- atomic steps: db.session's writes and the step's record in one transaction --------------


def add_order(customer: str, fail: bool) -> int:
    """An atomic step's function: a write through ``db.session`` (no connection given)."""
    import shop_flask  # noqa: PLC0415

    order = shop_flask.Order(customer=customer, total_cents=100)
    shop_flask.db.session.add(order)
    shop_flask.db.session.flush()
    if fail:
        raise ValueError("failed after db.session's write")
    return int(order.id)


def add_order_then_lose_the_job(customer: str, job_id: str) -> int:
    """A write through ``db.session``, then another owner takes the job, seen inside the
    step's transaction (on SQLite a write from elsewhere would wait for it)."""
    import shop_flask  # noqa: PLC0415
    from sqlalchemy import text  # noqa: PLC0415

    order_id = add_order(customer, fail=False)
    shop_flask.db.session.execute(
        text("UPDATE jobs SET owner = 'usurper', fence = fence + 1 WHERE id = :id"),
        {"id": job_id},
    )
    return order_id


ATOMIC_STEPS = AtomicOrmSteps("flask_atomic_order", "add", add_order, add_order_then_lose_the_job)


def test_an_atomic_step_commits_db_sessions_write_with_its_record(shop: Shop) -> None:
    ATOMIC_STEPS.commit_with_their_record(shop.orders_of)


def test_an_atomic_step_that_raises_leaves_neither_db_sessions_write_nor_its_record(
    shop: Shop,
) -> None:
    ATOMIC_STEPS.leave_nothing_when_they_raise(
        shop.orders_of, "ValueError: failed after db.session's write"
    )


def test_a_stale_owners_atomic_step_rolls_back_db_sessions_write(shop: Shop) -> None:
    ATOMIC_STEPS.roll_back_for_a_stale_owner(shop.orders_of)


def test_an_atomic_step_with_the_jobs_in_another_database_is_refused(
    shop: Shop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ATOMIC_STEPS.are_refused_with_the_jobs_elsewhere(
        shop.orders_of, tmp_path, monkeypatch, "is not the app's"
    )
