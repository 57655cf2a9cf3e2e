"""Django for the tests: the example shop (examples/django) configured once per test
process, with databases added per test world (a SQLite file, the session's or a Stack's
PostgreSQL database) and a router that sends the shop's queries to the one in use.

Django is configured at most once per process; the ``settings.JOBS`` source it installs
is removed after every test (:func:`django_world`), so other tests never see it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "django"


class ShopRouter:
    """Every query of the test goes to :attr:`alias`."""

    alias = "default"

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return self.alias

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return self.alias

    def allow_relation(self, *args: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return True


ROUTER = ShopRouter()


def configure(default_sqlite: Path) -> None:
    """Configure and set up Django once for this process."""
    import django  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415

    if settings.configured:
        return
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    settings.configure(
        SECRET_KEY="tests",
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "jobs.contrib.django",
            "orders",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
            "jobs.contrib.django.AdmissionRefusedMiddleware",
        ],
        ROOT_URLCONF="shop.urls",
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        DATABASES={"default": sqlite_database(default_sqlite)},
        DATABASE_ROUTERS=[ROUTER],
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        JOBS={"IMPORTS": ["orders.jobs"]},
    )
    django.setup()


def sqlite_database(path: Path) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        "ATOMIC_REQUESTS": True,
    }


def database_for(url: str) -> dict[str, Any]:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return sqlite_database(Path(str(parsed.database)))
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
        "ATOMIC_REQUESTS": True,
    }


TEMPORARY: list[str] = []


def use_database(alias: str, url: str, *, keep: bool = True) -> str:
    """Add ``url`` as Django database ``alias`` (migrated), and route the shop to it.
    ``keep=False``: forget it when the test ends (a database the test drops; with
    ATOMIC_REQUESTS every request would otherwise open a transaction on it)."""
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    if not keep:
        TEMPORARY.append(alias)
    if alias not in connections.settings:
        configured = connections.configure_settings(
            {"default": connections.settings["default"], alias: database_for(url)}
        )
        connections.settings[alias] = configured[alias]
        call_command("migrate", database=alias, verbosity=0)
    ROUTER.alias = alias
    return alias


@pytest.fixture
def django_world(
    jobs_isolated: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Django set up, the settings.JOBS source in place for this test only."""
    from jobs.application import default_app  # noqa: PLC0415
    from jobs.contrib.django.ambient import joining_django_transactions  # noqa: PLC0415
    from jobs.contrib.django.apps import database_url, settings_env  # noqa: PLC0415
    from jobs.contrib.django.step_transactions import django_step_transactions  # noqa: PLC0415

    configure(tmp_path_factory.getbasetemp() / "django-default.sqlite3")
    default_app().set_defaults_source(settings_env)
    # What the app's ready() does (once per process), for this test only.
    default_app().transactions.join_from(joining_django_transactions(database_url))
    default_app().registry.open_steps_with(django_step_transactions(database_url))
    try:
        yield
    finally:
        from django.db import connections  # noqa: PLC0415

        connections.close_all()
        while TEMPORARY:
            alias = TEMPORARY.pop()
            del connections[alias]
            del connections.settings[alias]
        ROUTER.alias = "default"
        default_app().set_defaults_source(None)
        default_app().transactions.join_from(None)
        default_app().registry.open_steps_with(None)
