"""A small order shop on durable jobs. ``SHOP_DATABASE_URL`` picks the database (a SQLite
file under ``jobs-data/`` by default, or ``postgresql://...``); the job tables live in the
same database, so an order and its check job commit together."""

import os
from pathlib import Path

from sqlalchemy.engine import make_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("JOBS_DATA_DIR") or BASE_DIR / "jobs-data").absolute()
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("SHOP_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "jobs.contrib.django",
    "orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "jobs.contrib.django.AdmissionRefusedMiddleware",
]
ROOT_URLCONF = "shop.urls"
TEMPLATES = [
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
]


def _database(url: str) -> dict[str, object]:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": parsed.database,
            # The jobs' workers write to the same file: wait for them, and take the write
            # lock at BEGIN (a deferred transaction cannot wait for it later).
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
            "ATOMIC_REQUESTS": True,
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
        "ATOMIC_REQUESTS": True,
    }


DATABASES = {
    "default": _database(
        os.environ.get("SHOP_DATABASE_URL") or f"sqlite:///{DATA_DIR / 'shop.sqlite3'}"
    )
}
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

# Durable jobs: the JOBS_* names without the prefix (JOBS_* environment variables win).
# Without DATABASE_URL the jobs live in Django's default database.
JOBS = {
    "DATA_DIR": str(DATA_DIR),
    "IMPORTS": ["orders.jobs"],
}
