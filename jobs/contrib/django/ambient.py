"""A plain ``jobs.submit`` (or ``.delay()``) inside Django's ``transaction.atomic()`` joins
it: the job commits or rolls back with the view's data, and its doorbell rings from
``transaction.on_commit``. (The app's ``ready()`` sets this up.)

Joined: the innermost atomic block open on the jobs' own database, on this thread. Left
alone: a submit outside any ``atomic()``, an ``atomic()`` on another database, and the
blocks Django's ``TestCase`` wraps each test in (a test's jobs commit as before, so
``jobs.testing.drain`` still sees them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from django.db import connections

from jobs._config.database_urls import same_database
from jobs._core.errors import SettingsError
from jobs._service.unit import AmbientUnit, UnitOfWork
from jobs.application import default_app
from jobs.contrib.django.orm_unit import DjangoUnit

UrlOf = Callable[[str], str]
"""A Django database alias's SQLAlchemy URL (``jobs.contrib.django.apps.database_url``)."""


def joining_django_transactions(url_of: UrlOf) -> AmbientUnit:
    """What ``join_transactions_from`` takes for Django: for one submit, the caller's
    Django transaction on the jobs' database as a unit of work, or ``None`` when it is in
    none (``url_of``: how an alias's URL is read)."""

    @contextlib.contextmanager
    def django_transaction() -> Iterator[UnitOfWork | None]:
        alias = atomic_alias(default_app().settings.database_url, url_of)
        if alias is None:
            yield None
            return
        with DjangoUnit(alias) as unit:
            yield unit

    return django_transaction


def atomic_alias(jobs_url: str, url_of: UrlOf) -> str | None:
    """The alias of this thread's Django connection that is inside an ``atomic()`` of its
    own (not only a ``TestCase``'s) on the database ``jobs_url`` names, if any."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            continue
        if all(getattr(block, "_from_testcase", False) for block in connection.atomic_blocks):
            continue
        try:
            django_url = url_of(connection.alias)
        except SettingsError:
            continue  # a database the jobs cannot live in (another vendor)
        if same_database(jobs_url, django_url):
            return str(connection.alias)
    return None
