"""A long job that reports its progress: import ``rows`` rows in ``batches`` steps, calling
``ctx.progress(done, total, message)`` after every row (docs/guides/long-jobs.md).

However often it is called, the progress is written to the job's row about once a second
(and at each batch's end, whose step record keeps it): ``jobctl show``, ``jobctl explain``,
a result's ``.info``, Flower's Jobs view and the Django admin show it while the job runs.
"""

from __future__ import annotations

import time
from typing import Any

import jobs


def import_batch(
    ctx: jobs.JobContext, first: int, count: int, total: int, seconds: float, message: str
) -> dict[str, int]:
    """Import rows ``first`` to ``first + count - 1`` (here: wait ``seconds`` spread over
    them), reporting progress after each one."""
    pause = seconds / count if count else 0.0
    for index in range(first, first + count):
        if pause:
            time.sleep(pause)
        ctx.progress(index + 1, total, f"{message}: row {index + 1} of {total}")
    return {"first": first, "rows": count}


@jobs.job("import_rows", max_attempts=3)
def import_rows(
    ctx: jobs.JobContext,
    rows: int,
    batches: int = 1,
    seconds: float = 0.0,
    message: str = "importing",
) -> dict[str, Any]:
    """Import ``rows`` rows in ``batches`` recorded steps (a retry resumes after the last
    recorded batch), taking about ``seconds`` in all."""
    size = -(-rows // batches)  # the last batch may be shorter
    imported = 0
    for batch in range(batches):
        first = batch * size
        count = max(0, min(size, rows - first))
        done = ctx.step(
            f"batch-{batch}", import_batch, ctx, first, count, rows, seconds / batches, message
        )
        imported += done["rows"]
    return {"imported": imported}
