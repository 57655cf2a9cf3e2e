"""What versions cost the claim (issue 26 part 5), measured back to back in one run, with the
method of :mod:`bench.per_key`: each side claims ``--claims`` jobs one at a time, each
claim timed alone (a completion after it, untimed), in a process of its own on a fresh
database, the sides taking turns over ``--rounds`` rounds:

- ``before``: the claim before versions (``--base``, exported to a scratch folder);
- ``after``: this code, a kind without a version (the statement must be the one it was);
- ``after, versioned``: this code, the kind at ``version="2"`` running versions 1 and 2
  (the ``CASE`` in the claim's ``SET`` and the version clause in its WHERE).

Every side claims with the worker's kinds (``kinds=[…]``), as a worker does. Then, less
exposed to a shared machine's noise, one process of this code claims ``--claims`` jobs with
each statement in turn (job by job, the order swapped every other job), and reports each
statement's wall time and the client's CPU time per claim.

    python -m bench.versions [--claims 2000] [--rounds 3] [--base 3bf43d4] [--pg-url …]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.per_key import export_base
from bench.scenarios import REPO, _base_env
from bench.services import pg_database
from bench.stats import median

# Run with the code under test first on sys.path.
CLAIM_CHILD = r"""
import json, sys, time, uuid
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import upgrade

url, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
engine = make_engine(url)
upgrade(engine)
store = JobStore(engine)
kind = "claim_cost"
options = {}
if mode == "versioned":
    from jobs._core.kind_versions import kind_versions
    options["versions"] = kind_versions([(kind, "2", ("1",))])
tag = uuid.uuid4().hex[:8]
rows = [
    store.submissions.new_job_values(
        kind, {}, job_id=f"{tag}-{n}", max_attempts=1, delay_seconds=0, code_version=None)
    for n in range(count)
]
for start in range(0, count, 1000):
    store.submissions.create_many(kind, rows[start:start + 1000])
times = []
for n in range(count):
    started = time.perf_counter()
    claim = store.ownership.claim(f"{tag}-{n}", "bench", 30, kinds=[kind], **options)
    times.append(time.perf_counter() - started)
    assert claim is not None, n
    if mode == "versioned":
        assert claim.job.code_version == "2", claim.job
    store.ownership.complete(claim, None)
engine.dispose()
times.sort()
print(json.dumps({"median_us": times[len(times) // 2] * 1e6,
                  "mean_us": sum(times) / len(times) * 1e6}))
"""

INTERLEAVED_CHILD = r"""
import json, sys, time, uuid
from jobs._core.kind_versions import kind_versions
from jobs._store import JobStore
from jobs._store.db import make_engine
from jobs._store.schema import upgrade

url, count = sys.argv[1], int(sys.argv[2])
engine = make_engine(url)
upgrade(engine)
store = JobStore(engine)
kind = "claim_cost"
versions = kind_versions([(kind, "2", ("1",))])
rows = [
    store.submissions.new_job_values(
        kind, {}, job_id=f"{mode}-{n}", max_attempts=1, delay_seconds=0, code_version=None)
    for mode in ("plain", "versioned") for n in range(count)
]
for start in range(0, len(rows), 1000):
    store.submissions.create_many(kind, rows[start:start + 1000])
wall = {"plain": [], "versioned": []}
cpu = {"plain": [], "versioned": []}
for n in range(count):
    for mode in (("plain", "versioned") if n % 2 else ("versioned", "plain")):
        options = {"versions": versions} if mode == "versioned" else {}
        started, used = time.perf_counter(), time.process_time()
        claim = store.ownership.claim(f"{mode}-{n}", "bench", 30, kinds=[kind], **options)
        wall[mode].append(time.perf_counter() - started)
        cpu[mode].append(time.process_time() - used)
        assert claim is not None, (mode, n)
        store.ownership.complete(claim, None)
engine.dispose()
found = {}
for mode in wall:
    walls, cpus = sorted(wall[mode]), sorted(cpu[mode])
    found[mode] = {"median_us": walls[len(walls) // 2] * 1e6,
                   "cpu_median_us": cpus[len(cpus) // 2] * 1e6}
print(json.dumps(found))
"""


def run_child(pg_url: str, code_root: Path, script: str, *args: str) -> dict[str, Any]:
    """The JSON a child running ``script`` with the code in ``code_root`` prints last, on a
    fresh database."""
    with pg_database(pg_url) as url:
        done = subprocess.run(
            [sys.executable, "-c", script, url, *args],
            env={**_base_env(), "PYTHONPATH": str(code_root)},
            capture_output=True,
            text=True,
            check=False,
            cwd=tempfile.gettempdir(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"claim child failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


def claim_cost(pg_url: str, code_root: Path, count: int, mode: str) -> dict[str, float]:
    """Per-claim microseconds (median, mean) of ``count`` claims by the code in
    ``code_root`` (``mode``: ``plain`` or ``versioned``), on a fresh database."""
    return run_child(pg_url, code_root, CLAIM_CHILD, str(count), mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default="3bf43d4", help="the commit before versions")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as scratch:
        base = export_base(args.base, Path(scratch) / "before")
        sides = {
            "before": (base, "plain"),
            "after": (REPO, "plain"),
            "after, versioned": (REPO, "versioned"),
        }
        costs: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(args.rounds):
            for side, (code_root, mode) in sides.items():
                cost = claim_cost(args.pg_url, code_root, args.claims, mode)
                costs[side].append(cost["median_us"])
                print(
                    f"claim round {round_ + 1} {side:16s}: {cost['median_us']:7.1f} us "
                    f"median, {cost['mean_us']:7.1f} us mean",
                    flush=True,
                )
        for side, values in costs.items():
            ratio = median(values) / median(costs["before"])
            print(
                f"claim {side:16s}: median of medians {median(values):7.1f} us "
                f"({ratio:.3f} x before)"
            )
    both = run_child(args.pg_url, REPO, INTERLEAVED_CHILD, str(args.claims))
    for mode, cost in both.items():
        print(
            f"interleaved {mode:9s}: {cost['median_us']:7.1f} us median wall, "
            f"{cost['cpu_median_us']:6.1f} us median client CPU"
        )


if __name__ == "__main__":
    main()
