"""Integrations with web frameworks: ``jobs.contrib.django`` and ``jobs.contrib.flask``.

They import the core, the runtime and :mod:`jobs.api`; nothing outside this package
imports them (the layers point one way)."""
