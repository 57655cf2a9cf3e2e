"""jobs.contrib.django through the example shop and Django's test client, in-process
(jobs run with jobs.testing.drain), on a SQLite file shared by Django and the jobs and
on PostgreSQL: an order and its job commit or roll back together, the doorbell rings only
after the commit, a full queue answers 429 and saves nothing, the admin approves (as the
admin user) and cancels, settings come from settings.JOBS under the environment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")

import jobs
from jobs import testing
from jobs._core.errors import AdmissionRefused, SettingsError
from jobs._core.states import State
from jobs.application import default_app
from tests import django_site
from tests.conftest import (
    PAGE_BIG_STEPS,
    PAGE_CHILDREN,
    PAGE_OUTPUT_CHARS,
    AllocationPeak,
    AtomicOrmSteps,
    assert_children_paged,
    assert_outputs_escaped,
    page_probe_kinds,
    whole_output,
)
from tests.django_site import use_database

django_world = django_site.django_world

KIND = "check_shop_order"


class Doorbell:
    """Records the job IDs the doorbell rang for, in order."""

    def __init__(self) -> None:
        self.rung: list[str] = []

    def __call__(self, job_id: str) -> None:
        self.rung.append(job_id)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shop(
    request: pytest.FixtureRequest,
    django_world: None,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Doorbell]:
    """The shop on a database shared by Django and the jobs; yields the doorbell."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.getbasetemp() / 'shop-shared.sqlite3'}"
        alias = "shop_sqlite"
    else:
        url = request.getfixturevalue("clean_pg_web_url")
        alias = "shop_pg"
    monkeypatch.setenv("JOBS_DATABASE_URL", url)

    default_app().reset_settings()
    jobs.reset()
    import orders.jobs  # noqa: F401, PLC0415 - the shop's job kind

    # Outside any request: brings a fresh SQLite file's job tables to head (and to WAL),
    # and seeds the declared limits.
    jobs.seed_limits()
    use_database(alias, url)

    doorbell = Doorbell()
    jobs.set_doorbell(doorbell)
    jobs.set_limits(KIND, max_queued=None)
    return doorbell


def rolled_back(alias: str, work: Any) -> Any:
    """Run ``work()`` in ``atomic()`` on ``alias``, then fail so that it rolls back; return
    what ``work`` returned."""
    from django.db import transaction  # noqa: PLC0415

    returned = []

    def fail_after_work() -> None:
        with transaction.atomic(using=alias):
            returned.append(work())
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError, match="roll back"):
        fail_after_work()
    return returned[0]


def post(client: Any, path: str, body: dict[str, Any]) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json")


def orders_of(customer: str) -> int:
    from orders.models import Order  # noqa: PLC0415

    return Order.objects.filter(customer=customer).count()


def test_an_order_and_its_job_commit_together_and_the_job_uses_the_orm(shop: Doorbell) -> None:
    from django.test import Client  # noqa: PLC0415

    client = Client()
    response = post(client, "/orders", {"customer": "ada", "total_cents": 500})
    assert response.status_code == 201, response.content
    body = response.json()
    assert orders_of("ada") == 1
    assert jobs.get(body["job_id"]).state is State.QUEUED
    assert shop.rung == [body["job_id"]]  # rung once, after the commit

    results = testing.drain()
    assert [r.job_id for r in results] == [body["job_id"]]
    shown = client.get(f"/orders/{body['order_id']}").json()
    assert shown["checked"] is True  # the handler's ORM write
    assert shown["job"]["state"] == "COMPLETED"


def test_a_failed_request_leaves_no_order_no_job_and_no_doorbell(shop: Doorbell) -> None:
    from django.test import Client  # noqa: PLC0415

    before = len(jobs.list_jobs(kind=KIND, limit=1000))
    client = Client(raise_request_exception=False)
    response = post(
        client, "/orders", {"customer": "bob", "total_cents": 500, "fail_after_submit": True}
    )
    assert response.status_code == 500
    assert orders_of("bob") == 0
    assert len(jobs.list_jobs(kind=KIND, limit=1000)) == before
    assert shop.rung == []


def test_a_full_queue_answers_429_with_retry_after_and_saves_nothing(shop: Doorbell) -> None:
    from django.test import Client  # noqa: PLC0415

    jobs.set_limits(KIND, max_queued=0)
    response = post(Client(), "/orders", {"customer": "cy", "total_cents": 500})
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert orders_of("cy") == 0
    assert shop.rung == []


def test_approval_through_the_app_resumes_a_waiting_job(shop: Doorbell) -> None:
    """The shop's approve endpoint acts as the logged-in staff user holding
    ``durable_jobs.approve_job`` and takes Django's CSRF token: anonymous is 401, without
    the permission 403, without the token 403, each changing nothing; the approval is
    recorded under the user's name, whatever the body's ``by`` says."""
    from django.test import Client  # noqa: PLC0415

    client = Client(enforce_csrf_checks=True)
    created = post(client, "/orders", {"customer": "dee", "total_cents": 250_000}).json()
    testing.drain()
    job_id = created["job_id"]
    assert jobs.get(job_id).state is State.WAITING_APPROVAL
    approve = f"/orders/{created['order_id']}/approve"
    assert post(client, approve, {"by": "erin"}).status_code == 403  # no CSRF token
    assert post(Client(), approve, {"by": "erin"}).status_code == 401  # not logged in

    client.force_login(staff_user("clerk", "view_jobrow"))
    client.get("/admin/")  # a page with a form: Django sets the csrftoken cookie
    token = {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value}
    refused = client.post(approve, "{}", content_type="application/json", **token)
    assert refused.status_code == 403, refused.content

    client.force_login(staff_user("erin", "view_jobrow", "approve_job"))
    client.get("/admin/")
    token = {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value}
    forged = post(client, approve, {"by": "mallory"})  # no token: a cross-site form
    assert forged.status_code == 403
    assert b"CSRF" in forged.content
    assert jobs.get(job_id).state is State.WAITING_APPROVAL

    body = json.dumps({"by": "mallory"})
    approved = client.post(approve, body, content_type="application/json", **token)
    assert approved.status_code == 200, approved.content
    assert shop.rung[-1] == job_id
    again = client.post(approve, body, content_type="application/json", **token)
    assert again.status_code == 409
    testing.drain()
    job = jobs.get(job_id)
    assert job.state is State.COMPLETED
    assert job.result == {"order_id": created["order_id"], "approved_by": "erin"}


def test_the_admin_lists_shows_approves_as_the_user_and_cancels(shop: Doorbell) -> None:
    from django.contrib.auth.models import User  # noqa: PLC0415
    from django.test import Client  # noqa: PLC0415

    from tests.django_site import ROUTER  # noqa: PLC0415

    User.objects.db_manager(ROUTER.alias).filter(username="boss").delete()
    User.objects.db_manager(ROUTER.alias).create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(User.objects.db_manager(ROUTER.alias).get(username="boss"))
    big = post(client, "/orders", {"customer": "eve", "total_cents": 300_000}).json()
    other = post(client, "/orders", {"customer": "fay", "total_cents": 300_000}).json()
    testing.drain()

    listing = client.get("/admin/durable_jobs/jobrow/", {"state__exact": "WAITING_APPROVAL"})
    assert listing.status_code == 200
    assert big["job_id"] in listing.content.decode()
    searched = client.get("/admin/durable_jobs/jobrow/", {"q": big["job_id"]}).content.decode()
    assert big["job_id"] in searched
    assert other["job_id"] not in searched
    page = client.get(f"/admin/durable_jobs/jobrow/{big['job_id']}/change/").content.decode()
    assert "load" in page  # its recorded step
    assert "WAITING_APPROVAL" in page  # its history

    changelist = "/admin/durable_jobs/jobrow/"
    acted = client.post(
        changelist, {"action": "approve_jobs", "_selected_action": [big["job_id"]]}, follow=True
    )
    assert acted.status_code == 200
    assert shop.rung[-1] == big["job_id"]
    approval = [t for t in jobs.history(big["job_id"]) if t.approved_by]
    assert [t.approved_by for t in approval] == ["admin:boss"]
    client.post(changelist, {"action": "cancel_jobs", "_selected_action": [other["job_id"]]})
    assert jobs.get(other["job_id"]).state is State.CANCELLED
    testing.drain()
    assert jobs.get(big["job_id"]).state is State.COMPLETED
    # Retry the cancelled one from its failed step, as the admin user; a completed job is
    # refused with a warning and left alone.
    client.post(
        changelist,
        {"action": "retry_jobs", "_selected_action": [other["job_id"], big["job_id"]]},
    )
    assert jobs.get(other["job_id"]).state is State.QUEUED
    assert shop.rung[-1] == other["job_id"]
    assert "retried by admin:boss" in (jobs.history(other["job_id"])[-1].reason or "")
    assert jobs.get(big["job_id"]).state is State.COMPLETED


def test_the_admin_shows_a_jobs_progress_in_the_list_and_on_its_page(shop: Doorbell) -> None:
    from django.contrib.auth.models import User  # noqa: PLC0415
    from django.test import Client  # noqa: PLC0415

    import jobs.examples.long_import  # noqa: F401, PLC0415 - the import_rows kind
    from tests.django_site import ROUTER  # noqa: PLC0415

    User.objects.db_manager(ROUTER.alias).filter(username="boss").delete()
    User.objects.db_manager(ROUTER.alias).create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(User.objects.db_manager(ROUTER.alias).get(username="boss"))
    job = testing.perform_job(
        "import_rows", {"rows": 10, "batches": 2, "message": "<b>copying</b>"}
    )
    assert job.state is State.COMPLETED, job.last_error

    listing = client.get("/admin/durable_jobs/jobrow/", {"q": job.id}).content.decode()
    assert "10/10 (100%): &lt;b&gt;copying&lt;/b&gt;: row 10 of 10" in listing
    page = client.get(f"/admin/durable_jobs/jobrow/{job.id}/change/").content.decode()
    assert '<progress max="1000" value="1000">100%</progress>' in page
    assert "progress 5/10 (50%): &lt;b&gt;copying&lt;/b&gt;: row 5 of 10" in page  # batch-0
    assert "<b>copying</b>" not in page


def test_the_admin_names_pauses_above_the_list_and_says_why_a_job_waits(shop: Doorbell) -> None:
    """A paused kind is named above the list (escaped), a job's page carries explain's
    paragraph (held by the pause, and what to do), and the list shows the job's concurrency
    key; once resumed, neither names the pause and the job runs."""
    from django.test import Client  # noqa: PLC0415

    from tests.django_site import ROUTER  # noqa: PLC0415

    kind = f"keyed_{ROUTER.alias}"
    jobs.job(kind, concurrency_key="tenant", max_running_per_key=1)(lambda ctx, tenant: None)
    client = Client()
    client.force_login(staff_user("viewer", "view_jobrow"))
    app = default_app()
    app.limits.pause(kind=kind, by="ops", reason="<b>incident</b>")
    try:
        job_id = jobs.submit(kind, {"tenant": "acme"})
        listing = client.get("/admin/durable_jobs/jobrow/").content.decode()
        assert f"Kind &#x27;{kind}&#x27; paused since" in listing
        assert "by ops (&lt;b&gt;incident&lt;/b&gt;): no worker claims its jobs" in listing
        assert "acme" in listing  # the key column
        page = client.get(f"/admin/durable_jobs/jobrow/{job_id}/change/").content.decode()
        assert "but it is held: kind" in page
        assert f"jobctl resume {kind} to run it" in page
        assert "<b>incident</b>" not in page
    finally:
        app.limits.resume(kind=kind)
    listing = client.get("/admin/durable_jobs/jobrow/").content.decode()
    assert "paused since" not in listing
    page = client.get(f"/admin/durable_jobs/jobrow/{job_id}/change/").content.decode()
    assert "but it is held" not in page
    testing.drain()
    assert jobs.get(job_id).state is State.COMPLETED


def test_limits_declared_on_the_kind_hold_from_the_first_submit_even_after_a_rollback(
    shop: Doorbell,
) -> None:
    """max_queued on @jobs.job is enforced before any worker ever started, including when
    the seed was written in a caller's transaction that rolled back."""
    import jobs.contrib.django  # noqa: PLC0415
    from tests.django_site import ROUTER  # noqa: PLC0415

    kind = f"limited_{ROUTER.alias}"
    jobs.job(kind, max_queued=1)(lambda ctx: None)
    rolled_back(ROUTER.alias, lambda: jobs.contrib.django.submit(kind, using=ROUTER.alias))
    assert jobs.list_jobs(kind=kind) == []
    jobs.contrib.django.submit(kind, using=ROUTER.alias)
    with pytest.raises(AdmissionRefused):
        jobs.contrib.django.submit(kind, using=ROUTER.alias)
    with pytest.raises(AdmissionRefused):
        jobs.submit(kind)


def test_a_plain_submit_or_delay_inside_atomic_joins_djangos_transaction(
    shop: Doorbell,
) -> None:
    """jobs.submit and .delay() given no transaction join the caller's atomic() on the jobs'
    database: a rollback leaves no job and rings nothing; a commit rings after it."""
    from django.db import transaction  # noqa: PLC0415
    from orders.jobs import check_order  # noqa: PLC0415

    from tests.django_site import ROUTER  # noqa: PLC0415

    alias = ROUTER.alias
    before = len(jobs.list_jobs(kind=KIND, limit=1000))
    ids = rolled_back(
        alias, lambda: [jobs.submit(KIND, {"order_id": 1}), check_order.delay(order_id=2).id]
    )
    assert len(ids) == 2
    for job_id in ids:
        with pytest.raises(jobs.UnknownJob):
            jobs.get(job_id)
    assert len(jobs.list_jobs(kind=KIND, limit=1000)) == before
    assert shop.rung == []
    with transaction.atomic(using=alias):
        joined = check_order.delay(order_id=3).id
        assert shop.rung == []  # not before the commit
    assert shop.rung == [joined]
    assert jobs.get(joined).state is State.QUEUED


def test_submit_on_commit_checks_admission_first_and_submits_after_the_commit(
    shop: Doorbell,
) -> None:
    from django.db import transaction  # noqa: PLC0415

    import jobs.contrib.django  # noqa: PLC0415
    from tests.django_site import ROUTER  # noqa: PLC0415

    with transaction.atomic(using=ROUTER.alias):
        job_id = jobs.contrib.django.submit_on_commit(KIND, {"order_id": 1}, using=ROUTER.alias)
        assert shop.rung == []
    assert jobs.get(job_id).state is State.QUEUED
    assert shop.rung == [job_id]

    rolled = rolled_back(
        ROUTER.alias,
        lambda: jobs.contrib.django.submit_on_commit(KIND, {"order_id": 2}, using=ROUTER.alias),
    )
    with pytest.raises(jobs.UnknownJob):
        jobs.get(rolled)

    jobs.set_limits(KIND, max_queued=1)
    with pytest.raises(AdmissionRefused), transaction.atomic(using=ROUTER.alias):
        jobs.contrib.django.submit_on_commit(KIND, {"order_id": 3}, using=ROUTER.alias)


def test_submit_refuses_a_job_table_in_another_database(
    shop: Doorbell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs.contrib.django  # noqa: PLC0415
    from tests.django_site import ROUTER  # noqa: PLC0415

    monkeypatch.setenv("JOBS_DATABASE_URL", f"sqlite:///{tmp_path / 'elsewhere.sqlite3'}")
    default_app().reset_settings()
    with pytest.raises(SettingsError, match="submit_on_commit"):
        jobs.contrib.django.submit(KIND, {"order_id": 1}, using=ROUTER.alias)


def test_settings_come_from_settings_jobs_and_the_environment_wins(
    django_world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.test import override_settings  # noqa: PLC0415

    with override_settings(JOBS={"LEASE_SECONDS": 7, "IMPORTS": ["a.b", "c"]}):
        default_app().reset_settings()
        settings = default_app().settings
        assert settings.lease_seconds == 7
        assert settings.imports == ("a.b", "c")
        assert settings.database_url.endswith("django-default.sqlite3")  # Django's default
        monkeypatch.setenv("JOBS_LEASE_SECONDS", "9")
        default_app().reset_settings()
        assert default_app().settings.lease_seconds == 9
    with override_settings(JOBS={"LEASE_SECOND": 7}):
        default_app().reset_settings()
        with pytest.raises(SettingsError, match=r"settings.JOBS: unknown setting 'LEASE_SECOND'"):
            default_app().settings  # noqa: B018 - reading them raises
    default_app().reset_settings()


def test_management_commands_wrap_jobctl_with_the_projects_settings(tmp_path: Path) -> None:
    """``manage.py jobs_stats`` reads settings.JOBS (the shop's own SQLite database) and a
    user's mistake is one line and a non-zero exit, as with jobctl."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from tests.django_site import EXAMPLE  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBS_", "DJANGO_"))}
    env["JOBS_DATA_DIR"] = str(tmp_path / "shop-data")
    manage = [sys.executable, str(EXAMPLE / "manage.py")]
    migrated = subprocess.run(
        [*manage, "migrate", "-v0"], env=env, capture_output=True, check=False
    )
    assert migrated.returncode == 0, migrated.stderr
    stats = subprocess.run(
        [*manage, "jobs_stats", "--json"], env=env, capture_output=True, check=False
    )
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["total"] == 0
    assert (tmp_path / "shop-data" / "shop.sqlite3").exists()  # Django's database, the jobs'
    wrong = subprocess.run(
        [*manage, "jobs_stats", "--bogus"], env=env, capture_output=True, check=False
    )
    assert wrong.returncode != 0
    assert b"Traceback" not in wrong.stderr
    assert b"--bogus" in wrong.stderr


@jobs.job("shop_square")
def shop_square(ctx: jobs.JobContext, n: int) -> int:
    return n * n


@jobs.job("shop_fan_out")
def shop_fan_out(ctx: jobs.JobContext, numbers: list[int]) -> int:
    return sum(ctx.map("shop_square", [{"n": n} for n in numbers]))


def test_the_admin_shows_a_waiting_parent_its_children_and_a_childs_parent(
    shop: Doorbell,
) -> None:
    from django.contrib.auth.models import User  # noqa: PLC0415
    from django.test import Client  # noqa: PLC0415

    from tests.django_site import ROUTER  # noqa: PLC0415

    User.objects.db_manager(ROUTER.alias).filter(username="boss").delete()
    User.objects.db_manager(ROUTER.alias).create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(User.objects.db_manager(ROUTER.alias).get(username="boss"))
    parent = testing.perform_job("shop_fan_out", {"numbers": [1, 2]})
    assert parent.state is State.WAITING
    first, second = f"{parent.id}.map.0", f"{parent.id}.map.1"
    testing.run(first)

    listing = client.get("/admin/durable_jobs/jobrow/", {"state__exact": "WAITING"})
    assert listing.status_code == 200
    assert parent.id in listing.content.decode()
    page = client.get(f"/admin/durable_jobs/jobrow/{parent.id}/change/").content.decode()
    assert "waiting for 1 of them" in page
    assert f'<a href="/admin/durable_jobs/jobrow/{first}/change/">{first}</a> COMPLETED' in page
    assert f'<a href="/admin/durable_jobs/jobrow/{second}/change/">{second}</a> QUEUED' in page
    child = client.get(f"/admin/durable_jobs/jobrow/{second}/change/").content.decode()
    assert f'<a href="/admin/durable_jobs/jobrow/{parent.id}/change/">{parent.id}</a>' in child


def staff_user(username: str, *codenames: str) -> Any:
    """A staff user (not a superuser) holding the ``durable_jobs`` permissions named."""
    from django.contrib.auth.models import Permission, User  # noqa: PLC0415

    from tests.django_site import ROUTER  # noqa: PLC0415

    users = User.objects.db_manager(ROUTER.alias)
    users.filter(username=username).delete()
    user = users.create_user(username, f"{username}@example.com", "pw", is_staff=True)
    granted = Permission.objects.db_manager(ROUTER.alias).filter(
        content_type__app_label="durable_jobs", codename__in=codenames
    )
    assert sorted(p.codename for p in granted) == sorted(codenames)
    user.user_permissions.set(granted)
    return users.get(pk=user.pk)  # a fresh object: no cached permissions


def test_each_admin_action_needs_a_permission_of_its_own(shop: Doorbell) -> None:
    """A staff user holding only the view permission sees jobs but is offered no action,
    and a POST of one is refused (403) and changes nothing; ``approve_job`` offers Approve
    and takes it (as that user), and still not Cancel or Retry."""
    from django.test import Client  # noqa: PLC0415

    changelist = "/admin/durable_jobs/jobrow/"
    client = Client()
    big = post(client, "/orders", {"customer": "gus", "total_cents": 300_000}).json()
    testing.drain()
    job_id = big["job_id"]
    assert jobs.get(job_id).state is State.WAITING_APPROVAL
    moves = len(jobs.history(job_id))

    client.force_login(staff_user("viewer", "view_jobrow"))
    listing = client.get(changelist)
    assert listing.status_code == 200
    assert job_id in listing.content.decode()
    for action in ("approve_jobs", "cancel_jobs", "retry_jobs"):
        assert action not in listing.content.decode()
        refused = client.post(changelist, {"action": action, "_selected_action": [job_id]})
        assert refused.status_code == 403, (action, refused.status_code)
    assert jobs.get(job_id).state is State.WAITING_APPROVAL
    assert len(jobs.history(job_id)) == moves
    assert client.get(f"{changelist}{job_id}/change/").status_code == 200

    client.force_login(staff_user("approver", "view_jobrow", "approve_job"))
    offered = client.get(changelist).content.decode()
    assert "approve_jobs" in offered
    assert "cancel_jobs" not in offered
    assert "retry_jobs" not in offered
    cancel = client.post(changelist, {"action": "cancel_jobs", "_selected_action": [job_id]})
    assert cancel.status_code == 403
    assert jobs.get(job_id).state is State.WAITING_APPROVAL
    approved = client.post(changelist, {"action": "approve_jobs", "_selected_action": [job_id]})
    assert approved.status_code == 302
    assert [t.approved_by for t in jobs.history(job_id) if t.approved_by] == ["admin:approver"]


def test_the_admin_change_page_pages_and_clips_with_memory_flat(
    shop: Doorbell, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A parent with 20,000 children and a job with sixty 1 MiB outputs: the change page
    shows a page of each table (links to the next), outputs clipped with a link to the
    whole value (plain text, for a user who may view jobs), stored HTML escaped; the page
    is small and rendering it allocates little."""
    from django.test import Client  # noqa: PLC0415

    monkeypatch.setenv("JOBS_LEASE_SECONDS", "600")  # in-process runs that write a lot
    default_app().reset_settings()
    jobs.reset()
    page_probe_kinds()
    parent = testing.perform_job("page_many_children", {"count": PAGE_CHILDREN})
    # The shop is shared: its 20,000 claimable children would make every later drain in
    # this process run 1,000 of them (30 s a test); cancelling the parent cancels them.
    request.addfinalizer(lambda: jobs.cancel(parent.id))
    big = testing.perform_job("page_big_outputs", {"steps": PAGE_BIG_STEPS})
    assert parent.state is State.WAITING, parent.last_error
    assert big.state is State.COMPLETED, big.last_error
    client = Client()
    client.force_login(staff_user("viewer", "view_jobrow"))
    page_of = "/admin/durable_jobs/jobrow/{}/change/"

    client.get(page_of.format(parent.id))  # warm: templates, permissions
    with AllocationPeak() as traced:
        children = client.get(page_of.format(parent.id))
        outputs = client.get(page_of.format(big.id))
    peak = traced.peak
    assert children.status_code == 200
    assert outputs.status_code == 200
    print(
        f"admin: children page {len(children.content)} bytes, outputs page "
        f"{len(outputs.content)} bytes, peak allocation {peak / 2**20:.1f} MiB"
    )
    assert len(children.content) < 200_000
    assert len(outputs.content) < 400_000
    assert peak < 30 * 2**20
    following = client.get(page_of.format(parent.id), {"children": 100}).content.decode()
    assert_children_paged(parent.id, children.content.decode(), following)

    shown = outputs.content.decode()
    assert f"the whole {PAGE_OUTPUT_CHARS + 2} characters" in shown
    assert_outputs_escaped(shown)
    value = f"/admin/durable_jobs/jobrow/{big.id}/value/"
    whole = client.get(value, {"step": "big-07"})
    assert whole.status_code == 200
    assert whole["Content-Type"].startswith("text/plain")
    assert whole["X-Content-Type-Options"] == "nosniff"
    assert whole.content.decode() == whole_output(7)
    assert client.get(value, {"step": "nope"}).status_code == 400
    assert client.get(value, {"field": "inputs"}).content.decode() == '{\n  "steps": 60\n}'
    client.force_login(staff_user("nobody"))
    assert client.get(value, {"step": "big-07"}).status_code == 403


def test_the_admin_list_reads_no_inputs_or_results(
    shop: Doorbell, request: pytest.FixtureRequest
) -> None:
    """Thirty jobs with inputs of almost 1 MiB each: the list page (100 to a page) reads
    none of them, so rendering it allocates little."""
    from django.test import Client  # noqa: PLC0415

    page_probe_kinds()
    for _ in range(30):
        padded = jobs.submit("page_padded", {"pad": "p" * PAGE_OUTPUT_CHARS})
        request.addfinalizer(lambda job_id=padded: jobs.cancel(job_id))  # the shop is shared
    client = Client()
    client.force_login(staff_user("viewer", "view_jobrow"))
    client.get("/admin/durable_jobs/jobrow/")  # warm
    with AllocationPeak() as traced:
        listing = client.get("/admin/durable_jobs/jobrow/")
    peak = traced.peak
    assert listing.status_code == 200
    print(f"admin list: {len(listing.content)} bytes, peak allocation {peak / 2**20:.1f} MiB")
    assert peak < 10 * 2**20


def test_submit_on_commit_refuses_a_reserved_job_id_before_the_commit(shop: Doorbell) -> None:
    """A caller-chosen ID of a child's form (or a tick's) is refused while the view can
    still roll back, not after its commit, when the refusal could only be logged."""
    from django.db import transaction  # noqa: PLC0415

    import jobs.contrib.django  # noqa: PLC0415
    from tests.django_site import ROUTER  # noqa: PLC0415

    for reserved in ("order-1.charge", "report@2030-01-01T00:00:00Z"):
        with (
            pytest.raises(jobs.InvalidInput, match="reserved"),
            transaction.atomic(using=ROUTER.alias),
        ):
            jobs.contrib.django.submit_on_commit(
                KIND, {"order_id": 1}, using=ROUTER.alias, job_id=reserved
            )
        with pytest.raises(jobs.UnknownJob):
            jobs.get(reserved)


# -- atomic steps: the ORM's writes and the step's record in one transaction -----------------


def create_order(customer: str, fail: bool) -> int:
    """An atomic step's function: an ORM write, in the step's transaction (no connection)."""
    from orders.models import Order  # noqa: PLC0415

    order = Order.objects.create(customer=customer, total_cents=100)
    if fail:
        raise ValueError("failed after the ORM's write")
    return int(order.pk)


def create_order_then_lose_the_job(customer: str, job_id: str) -> int:
    """An ORM write, then another owner takes the job, seen inside the step's transaction
    (written on Django's connection: on SQLite a write from elsewhere would wait for it)."""
    from django.db import connections  # noqa: PLC0415

    from tests.django_site import ROUTER  # noqa: PLC0415

    order_id = create_order(customer, fail=False)
    with connections[ROUTER.alias].cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET owner = 'usurper', fence = fence + 1 WHERE id = %s", [job_id]
        )
    return order_id


ATOMIC_STEPS = AtomicOrmSteps(
    "shop_atomic_order", "create", create_order, create_order_then_lose_the_job
)


def test_an_atomic_step_commits_the_orms_write_with_its_record(shop: Doorbell) -> None:
    ATOMIC_STEPS.commit_with_their_record(orders_of)


def test_an_atomic_step_that_raises_leaves_neither_the_orms_write_nor_its_record(
    shop: Doorbell,
) -> None:
    ATOMIC_STEPS.leave_nothing_when_they_raise(
        orders_of, "ValueError: failed after the ORM's write"
    )


def test_a_stale_owners_atomic_step_rolls_back_the_orms_write(shop: Doorbell) -> None:
    ATOMIC_STEPS.roll_back_for_a_stale_owner(orders_of)


def test_an_atomic_step_with_the_jobs_in_another_database_is_refused(
    shop: Doorbell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ATOMIC_STEPS.are_refused_with_the_jobs_elsewhere(
        orders_of, tmp_path, monkeypatch, "is none of settings.DATABASES"
    )
