"""Integrations with web frameworks: ``jobs.contrib.django`` and ``jobs.contrib.flask``.

They import the core, the runtime and the application's services (:mod:`jobs._service`);
nothing outside this package imports them (the layers point one way)."""
