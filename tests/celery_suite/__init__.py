"""Celery's own integration suite (``t/integration`` of Celery's source distribution) run
twice, on plain Celery and with durable jobs installed on the suite's app and running beside
its tests, and the two result sets compared test by test (:mod:`tests.celery_suite.harness`).

``python -m tests.celery_suite`` runs the whole suite (``make celery-suite``);
tests/acceptance/test_celery_suite.py runs a subset of it as one of the project's tests.
"""
