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

The command line and the before/after loop are :mod:`bench.claim_cost`'s.
"""

from __future__ import annotations

from bench.claim_cost import AFTER, BEFORE, bench_parser, compare_claims, run_child
from bench.scenarios import REPO

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


def main() -> None:
    parser = bench_parser(__doc__, base="3bf43d4", base_help="the commit before versions")
    args = parser.parse_args()
    sides = {
        "before": (BEFORE, "kinds"),
        "after": (AFTER, "kinds"),
        "after, versioned": (AFTER, "kinds,versioned"),
    }
    compare_claims(args, sides)
    both = run_child(args.pg_url, REPO, INTERLEAVED_CHILD, str(args.claims))
    for mode, cost in both.items():
        print(
            f"interleaved {mode:9s}: {cost['median_us']:7.1f} us median wall, "
            f"{cost['cpu_median_us']:6.1f} us median client CPU"
        )


if __name__ == "__main__":
    main()
