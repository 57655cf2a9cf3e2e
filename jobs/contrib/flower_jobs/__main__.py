"""``python -m jobs.contrib.flower_jobs [-A APP] [Flower's options]``: what ``jobctl
flower`` execs."""

from __future__ import annotations

import sys

from jobs.contrib.flower_jobs.server import DEFAULT_APP, main

if __name__ == "__main__":
    given = sys.argv[1:]
    if given[:1] == ["-A"] and len(given) > 1:  # a project's own app (JOBS_CELERY_APP)
        main(given[2:], given[1])
    else:
        main(given, DEFAULT_APP)
