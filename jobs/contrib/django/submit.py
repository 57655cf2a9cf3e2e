"""Submitting from Django: in the view's transaction, or after its commit."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from sqlalchemy.engine import make_url

import jobs
from jobs._config.database_urls import same_database
from jobs._core.errors import AdmissionRefused, SettingsError
from jobs._service.options import new_job_id
from jobs.application import default_app
from jobs.contrib.django.apps import database_url
from jobs.contrib.django.orm_unit import DjangoUnit


def _check_shared(using: str) -> None:
    jobs_url = default_app().runtime.settings.database_url
    if not _shared(using):
        raise SettingsError(
            f"the job tables ({make_url(jobs_url).render_as_string()}) are not in Django's "
            f"{using!r} database: use jobs.contrib.django.submit_on_commit"
        )


def submit(
    kind: str, inputs: dict[str, Any] | None = None, *, using: str | None = None, **options: Any
) -> str:
    """Queue a job in the current ``transaction.atomic()`` block of Django's ``using``
    database (one is opened if none is): the job commits or rolls back with the view's
    data, and its doorbell rings after the commit. ``options`` are :func:`jobs.submit`'s
    (``job_id``, ``max_attempts``, ``delay``, ``run_at``, ``priority``). The job tables must
    be in that database (they are, unless ``settings.JOBS["DATABASE_URL"]`` points
    elsewhere).

    On an error (:class:`jobs.AdmissionRefused`, ...), let it leave the ``atomic()`` block
    so the view's writes roll back too."""
    alias = using or "default"
    _check_shared(alias)
    with transaction.atomic(using=alias, savepoint=False), DjangoUnit(alias) as unit:
        return jobs.submit(kind, inputs, unit=unit, **options)


def submit_many(
    kind: str,
    inputs: Sequence[dict[str, Any]],
    *,
    using: str | None = None,
    **options: Any,
) -> list[str]:
    """:func:`submit` for many jobs of one kind (:func:`jobs.submit_many`)."""
    alias = using or "default"
    _check_shared(alias)
    with transaction.atomic(using=alias, savepoint=False), DjangoUnit(alias) as unit:
        return jobs.submit_many(kind, inputs, unit=unit, **options)


def _shared(using: str) -> bool:
    return same_database(default_app().runtime.settings.database_url, database_url(using))


def submit_on_commit(
    kind: str,
    inputs: dict[str, Any] | None = None,
    *,
    using: str | None = None,
    job_id: str | None = None,
    **options: Any,
) -> str:
    """Queue a job once Django's transaction on ``using`` has committed, for job tables
    in another database. Inputs and the kind's queue limit are checked now, so a refusal
    (:class:`jobs.AdmissionRefused`) can still roll the view back. Returns the job's ID,
    chosen now. The risk: the queue may fill up, or the process die, between the commit
    and the submit; the saved data then has no job (logged, never raised into the
    commit)."""
    default_app().jobs.check_submit(kind, inputs, job_id=job_id)
    chosen = job_id or new_job_id()
    transaction.on_commit(
        lambda: jobs.submit(kind, inputs, job_id=chosen, **options),
        using=using,
        robust=True,
    )
    return chosen


def refused_response(err: AdmissionRefused) -> HttpResponse:
    """429 Too Many Requests with ``Retry-After`` (whole seconds) for a full queue."""
    response = JsonResponse({"error": "queue full", "detail": str(err)}, status=429)
    response["Retry-After"] = str(max(1, math.ceil(err.retry_after)))
    return response


class AdmissionRefusedMiddleware:
    """``MIDDLEWARE = [..., "jobs.contrib.django.AdmissionRefusedMiddleware"]``: a view that
    raised :class:`jobs.AdmissionRefused` answers 429 with ``Retry-After``. With
    ``ATOMIC_REQUESTS`` (or a view's own ``atomic()``) the exception has already rolled
    the view's writes back."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, _request: HttpRequest, err: Exception) -> HttpResponse | None:
        if isinstance(err, AdmissionRefused):
            return refused_response(err)
        return None
