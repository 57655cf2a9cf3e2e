"""The example shops (examples/django, examples/flask) end to end with real worker
processes, on PostgreSQL + RabbitMQ and on the embedded default: a request's order and
job commit together and a real worker runs the job (which uses the app's models); a
request that fails leaves no order, no job and no message; approval through the app (and
the Django admin's action) resumes a waiting job in the worker; a full queue answers 429
with Retry-After and saves nothing. The Django worker is ``manage.py jobs_worker`` with
the project's settings module; the Flask worker is ``jobctl worker`` importing the app."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobs
from jobs._core.states import State
from jobs.application import default_app
from tests import django_site
from tests.acceptance.conftest import BOTH, EMBEDDED, Stack

ROOT = Path(__file__).resolve().parents[2]
DJANGO_EXAMPLE = ROOT / "examples" / "django"
FLASK_EXAMPLE = ROOT / "examples" / "flask"

django_world = django_site.django_world


def assert_no_message(stack: Stack) -> None:
    """Nothing reaches the queue (checked for a while: a publish would be immediate)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        assert stack.queue_depth() == (0, 0)
        time.sleep(0.2)


# -- Django ----------------------------------------------------------------------------------


@pytest.fixture
def django_shop(stack: Stack, django_world: None) -> Any:
    """The stack's database as the shop's, and a ``manage.py jobs_worker`` on it."""
    return start_django_shop(
        stack, [sys.executable, str(DJANGO_EXAMPLE / "manage.py"), "jobs_worker"]
    )


def start_django_shop(stack: Stack, launcher: list[str] | None) -> Any:
    """The shop on the stack's database and a worker started by ``launcher`` (``None``: the
    harness's ``jobctl worker``), with the Django settings module in its environment."""
    pytest.importorskip("django")
    # The jobs in the shop's database (on the embedded backend Django's settings.JOBS
    # would otherwise point this process at Django's default database).
    stack.configure(JOBS_IMPORTS="orders.jobs", JOBS_DATABASE_URL=stack.database_url)
    import orders.jobs  # noqa: F401, PLC0415 - the kind, in this process too

    jobs.seed_limits()  # the job tables at head (a fresh SQLite file), WAL on
    django_site.use_database(f"stack_{stack.queue}", stack.database_url, keep=False)
    stack.worker(
        "django",
        pool="prefork",
        launcher=launcher,
        env={
            "DJANGO_SETTINGS_MODULE": "shop.settings",
            "SHOP_DATABASE_URL": stack.database_url,
            "PYTHONPATH": str(DJANGO_EXAMPLE),
        },
    )
    from django.test import Client  # noqa: PLC0415

    return Client()


def post(client: Any, path: str, body: dict[str, Any]) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("stack", [EMBEDDED], indirect=True)
def test_jobctl_worker_in_a_django_project_sets_django_up_first(
    stack: Stack, django_world: None
) -> None:
    """``jobctl worker`` with DJANGO_SETTINGS_MODULE: the job modules import the project's
    models, so Django is set up before they load (it died with AppRegistryNotReady)."""
    from orders.models import Order  # noqa: PLC0415

    client = start_django_shop(stack, None)
    created = post(client, "/orders", {"customer": "ada", "total_cents": 500})
    assert created.status_code == 201, created.content
    order = created.json()
    assert stack.wait_state(order["job_id"]).state is State.COMPLETED
    assert Order.objects.get(pk=order["order_id"]).checked


@pytest.mark.slow
@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_django_shop_with_a_real_worker(stack: Stack, django_shop: Any) -> None:
    from django.contrib.auth.models import Permission, User  # noqa: PLC0415
    from orders.models import Order  # noqa: PLC0415

    client = django_shop
    created = post(client, "/orders", {"customer": "ada", "total_cents": 500})
    assert created.status_code == 201, created.content
    order = created.json()
    assert stack.wait_state(order["job_id"]).state is State.COMPLETED
    assert Order.objects.get(pk=order["order_id"]).checked  # the worker's ORM write

    client.raise_request_exception = False
    failed = post(client, "/orders", {"customer": "bob", "total_cents": 5, "fail_after_submit": 1})
    assert failed.status_code == 500
    assert not Order.objects.filter(customer="bob").exists()
    assert [j.id for j in jobs.list_jobs()] == [order["job_id"]]
    assert_no_message(stack)

    big = post(client, "/orders", {"customer": "cy", "total_cents": 250_000}).json()
    stack.wait_state(big["job_id"], (State.WAITING_APPROVAL,))
    approve = f"/orders/{big['order_id']}/approve"
    assert post(client, approve, {"by": "dee"}).status_code == 401  # staff only
    dee = User.objects.create_user("dee", "dee@example.com", "pw", is_staff=True)
    dee.user_permissions.add(Permission.objects.get(codename="approve_job"))
    client.force_login(dee)
    approved = post(client, approve, {"by": "mallory"})
    assert approved.status_code == 200, approved.content
    assert stack.wait_state(big["job_id"]).result == {
        "order_id": big["order_id"],
        "approved_by": "dee",
    }

    User.objects.create_superuser("boss", "boss@example.com", "pw")
    client.force_login(User.objects.get(username="boss"))
    other = post(client, "/orders", {"customer": "eve", "total_cents": 250_000}).json()
    stack.wait_state(other["job_id"], (State.WAITING_APPROVAL,))
    acted = client.post(
        "/admin/durable_jobs/jobrow/",
        {"action": "approve_jobs", "_selected_action": [other["job_id"]]},
    )
    assert acted.status_code == 302, acted.content
    done = stack.wait_state(other["job_id"])
    assert done.result == {"order_id": other["order_id"], "approved_by": "admin:boss"}

    jobs.set_limits("check_shop_order", max_queued=0)
    refused = post(client, "/orders", {"customer": "fay", "total_cents": 5})
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert not Order.objects.filter(customer="fay").exists()


# -- Flask -----------------------------------------------------------------------------------


@pytest.fixture
def flask_shop(stack: Stack) -> Iterator[Any]:
    """The shop app on the stack's database, and a ``jobctl worker`` that imports it."""
    pytest.importorskip("flask_sqlalchemy")
    if str(FLASK_EXAMPLE) not in sys.path:
        sys.path.insert(0, str(FLASK_EXAMPLE))
    stack.configure(JOBS_IMPORTS="shop_flask")
    import shop_flask  # noqa: PLC0415

    app = shop_flask.create_app(
        {"SQLALCHEMY_DATABASE_URI": stack.database_url, "SHOP_STAFF": {"dee": "t0k"}}
    )
    stack.worker(
        "flask",
        pool="prefork",
        env={"PYTHONPATH": str(FLASK_EXAMPLE), "SHOP_DATABASE_URL": stack.database_url},
    )
    try:
        yield app
    finally:
        with app.app_context():
            shop_flask.db.engine.dispose()
        jobs.REGISTRY.remove_job_scope(app.app_context)
        default_app().set_defaults_source(None)


@pytest.mark.slow
@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_flask_shop_with_a_real_worker(stack: Stack, flask_shop: Any) -> None:
    import shop_flask  # noqa: PLC0415

    client = flask_shop.test_client()

    def orders_of(customer: str) -> int:
        with flask_shop.app_context():
            query = shop_flask.db.session.query(shop_flask.Order)
            return query.filter_by(customer=customer).count()

    created = client.post("/orders", json={"customer": "ada", "total_cents": 500})
    assert created.status_code == 201, created.data
    order = created.get_json()
    assert stack.wait_state(order["job_id"]).state is State.COMPLETED
    assert client.get(f"/orders/{order['order_id']}").get_json()["checked"] is True

    flask_shop.config["PROPAGATE_EXCEPTIONS"] = False
    failed = client.post(
        "/orders", json={"customer": "bob", "total_cents": 5, "fail_after_submit": 1}
    )
    assert failed.status_code == 500
    assert orders_of("bob") == 0
    assert [j.id for j in jobs.list_jobs()] == [order["job_id"]]
    assert_no_message(stack)

    big = client.post("/orders", json={"customer": "cy", "total_cents": 250_000}).get_json()
    stack.wait_state(big["job_id"], (State.WAITING_APPROVAL,))
    approve = f"/orders/{big['order_id']}/approve"
    assert client.post(approve, json={"by": "dee"}).status_code == 401  # staff only
    approved = client.post(approve, json={"by": "mallory"}, headers={"Authorization": "Bearer t0k"})
    assert approved.status_code == 200
    assert stack.wait_state(big["job_id"]).result["approved_by"] == "dee"

    jobs.set_limits("check_flask_order", max_queued=0)
    refused = client.post("/orders", json={"customer": "fay", "total_cents": 5})
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 1
    assert orders_of("fay") == 0
