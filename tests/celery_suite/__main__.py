"""``python -m tests.celery_suite [--subset] [--plain-again] [--out DIR] [TEST ...]``: run
Celery's integration suite plain and with durable jobs installed, print the comparison,
and exit 0 when every test has the same outcome in both passes (1 otherwise).

With no TEST, the whole of ``t/integration``; ``--subset`` runs the files the project's
test runs (:data:`tests.celery_suite.harness.SUBSET`); ``--plain-again`` runs plain
Celery a second time, to find the tests flaky on plain Celery itself; ``--queue-type
quorum`` declares every queue a quorum queue (Celery's and the durable jobs')."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.celery_suite.harness import (
    FLAKY_ON_PLAIN_CELERY,
    QUEUE_TYPES,
    SUBSET,
    compare,
    default_output,
    differences_text,
    report,
    run_both,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.celery_suite", description=__doc__)
    parser.add_argument("tests", nargs="*", help="paths under the source tree (t/integration/…)")
    parser.add_argument("--subset", action="store_true", help="the project test's files only")
    parser.add_argument("--plain-again", action="store_true", help="a second plain pass")
    parser.add_argument(
        "--queue-type", choices=QUEUE_TYPES, default="classic", help="every queue's type"
    )
    parser.add_argument("--out", type=Path, help="where the logs go (default: a temp folder)")
    args = parser.parse_args(argv)
    tests = args.tests or (list(SUBSET) if args.subset else ["t/integration"])
    out = args.out or default_output()
    print(f"running {' '.join(tests)} plain and installed; logs in {out}", flush=True)
    plain, installed, again = run_both(
        tests, out, plain_again=args.plain_again, queue_type=args.queue_type
    )
    differences = compare(plain, installed, excluded=list(FLAKY_ON_PLAIN_CELERY))
    print(report(plain, installed, differences, again))
    (out / "differences.txt").write_text(differences_text(differences), encoding="utf-8")
    print(f"one line per test that differs: {out / 'differences.txt'}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
