"""Atomic steps under Django: ``ctx.step(name, fn, *args, atomic=True)`` runs ``fn`` inside
``transaction.atomic()`` on the Django database that holds the jobs, and the step's record
is written through that same connection (:class:`jobs.contrib.django.DjangoUnit`), so the
ORM's writes in ``fn`` and the record commit together or not at all. (The app's
``ready()`` sets this up.)

``fn`` takes no connection: the ORM is inside the transaction, for the queries Django sends
to that database (a router that sends a model elsewhere takes its writes out of it). Jobs
kept in a database none of ``settings.DATABASES`` names are refused at the step, in one
line: their record and the ORM's writes cannot share a transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connections, transaction

from jobs._config.database_urls import same_database
from jobs._core.errors import SettingsError, StepError
from jobs._core.records import StepTransaction, StepTransactions
from jobs.contrib.django.ambient import UrlOf
from jobs.contrib.django.orm_unit import DjangoUnit


def django_step_transactions(url_of: UrlOf) -> StepTransactions:
    """What ``Registry.step_transactions`` takes for Django: an atomic step's transaction on
    the Django database that is the jobs' one (``url_of``: how an alias's URL is read)."""

    @contextlib.contextmanager
    def open_transaction(jobs_url: str) -> Iterator[StepTransaction]:
        alias = jobs_alias(jobs_url, url_of)
        if alias is None:
            raise StepError(
                f"atomic step refused: the jobs' database ({jobs_url}) is none of "
                "settings.DATABASES, so the ORM's writes cannot share the step's transaction"
            )
        with transaction.atomic(using=alias), DjangoUnit(alias) as unit:
            yield StepTransaction(unit.connection, ())

    return open_transaction


def jobs_alias(jobs_url: str, url_of: UrlOf) -> str | None:
    """The alias of the Django database ``jobs_url`` names (``default`` first), if any."""
    aliases = sorted(connections.settings, key=lambda alias: alias != "default")
    for alias in aliases:
        try:
            django_url = url_of(alias)
        except SettingsError:
            continue  # a database the jobs cannot live in (another vendor, SQLite in memory)
        if same_database(jobs_url, django_url):
            return str(alias)
    return None


__all__ = ["django_step_transactions", "jobs_alias"]
