"""The process ``jobctl worker`` becomes: Celery's own ``worker`` command, without Celery's
command line around it.

``celery -A jobs.celery_app worker`` first builds Celery's whole command group: its REPL
(``click_repl``, ``prompt_toolkit``) and every installed plugin command (Flower, with Tornado
and ``prometheus_client``). A worker never uses them, yet each of its processes carries them:
about 16 MiB of the main process, inherited by every pool child. This module runs the same
click command (same options, same start-up, same signals) with the context Celery's group
would have made, and nothing else. ``celery -A jobs.celery_app worker`` keeps working.

    python -m jobs._worker.main -Q jobs -c 2 -l INFO   # what jobctl worker execs
    python -m jobs._worker.main -A proj -Q video       # with JOBS_CELERY_APP=proj
"""

from __future__ import annotations

import sys

DEFAULT_APP = "jobs.celery_app"


def main(argv: list[str], app_name: str = DEFAULT_APP) -> None:
    """Run ``celery worker`` with ``argv`` (its options only) on the Celery app ``app_name``
    names (``module`` or ``module:attribute``, as ``celery -A`` takes it)."""
    import celery  # noqa: PLC0415

    # -P gevent/eventlet patch the standard library before anything else imports it.
    celery.maybe_patch_concurrency(argv, short_opts=["-P"], long_opts=["--pool"])
    from celery.app.utils import find_app  # noqa: PLC0415
    from celery.bin.base import CLIContext  # noqa: PLC0415
    from celery.bin.worker import worker as worker_command  # noqa: PLC0415

    app = find_app(app_name)

    worker_command.params.extend(app.user_options.get("worker", []))
    worker_command.main(
        args=argv,
        prog_name="jobctl worker",
        obj=CLIContext(app=app, no_color=None, workdir=None, quiet=False),
    )


if __name__ == "__main__":
    given = sys.argv[1:]
    if given[:1] == ["-A"] and len(given) > 1:  # a project's own app (JOBS_CELERY_APP)
        main(given[2:], given[1])
    else:
        main(given)
