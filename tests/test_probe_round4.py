"""A fourth hostile probe of the hardened classes: the cases not tried before that found a
defect (see docs/operations/security.md)."""

from __future__ import annotations

import pytest

from jobs import testing
from jobs.core.errors import SettingsError
from jobs.core.settings import from_env
from tests.test_contrib_django import Doorbell, django_world, post, shop, staff_user

__all__ = ["django_world", "shop"]  # the fixtures the tests below use


@pytest.mark.parametrize(
    "query",
    ["kind__regex=(", "id__regex=[", "kind__iregex=((((a*)*)*)*$", "last_error__contains=x"],
)
def test_the_admin_list_takes_only_its_own_filters_from_the_query(
    shop: Doorbell, query: str
) -> None:
    """A user who may only view jobs gave the list lookups of Django's own
    (``?kind__regex=(``): a 500 from the database, and any regex run there. Only the list's
    filters are taken; anything else is a 400, and the filters still filter."""
    from django.test import Client  # noqa: PLC0415

    client = Client(raise_request_exception=False)
    job_id = post(client, "/orders", {"customer": "gus", "total_cents": 300}).json()["job_id"]
    testing.drain()
    client.force_login(staff_user("viewer", "view_jobrow"))
    changelist = "/admin/durable_jobs/jobrow/"
    assert client.get(f"{changelist}?{query}").status_code == 400
    done = client.get(f"{changelist}?state__exact=COMPLETED&kind__exact=check_shop_order")
    assert done.status_code == 200
    assert job_id in done.content.decode()
    assert job_id not in client.get(f"{changelist}?state__exact=FAILED").content.decode()


@pytest.mark.parametrize(
    ("queue", "said"),
    [
        ("amq.jobs", "RabbitMQ's own"),  # ACCESS_REFUSED on every declare
        ("é" * 200, "ASCII letters"),  # 400 bytes: past the 255 of a queue name
        ("jöbs", "ASCII letters"),  # a kind's queue may not be named so either
    ],
)
def test_a_default_queue_rabbitmq_refuses_is_refused_at_start(queue: str, said: str) -> None:
    """``JOBS_QUEUE=amq.jobs`` (or 200 accented letters) was accepted, and every doorbell
    then failed to publish ("ACCESS_REFUSED", "ubyte format requires 0 <= number <= 255"):
    the default queue is checked as a kind's queue is, in one line."""
    with pytest.raises(SettingsError, match=said) as refused:
        from_env({"JOBS_QUEUE": queue})
    assert "\n" not in str(refused.value)
    assert len(str(refused.value)) < 200
    assert from_env({"JOBS_QUEUE": "jobs.high-prio:eu_1"}).queue == "jobs.high-prio:eu_1"
