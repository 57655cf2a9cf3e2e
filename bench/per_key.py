"""What concurrency keys cost (issue 27 part 1), measured in one run:

1. the claim of a kind with no per-key limit, before the feature (the branch's base
   commit, exported to a scratch folder) and after it, back to back: each side in a
   process of its own on a fresh database, the sides taking turns over several rounds;
   each claim timed alone (a completion after it, untimed, so no key ever fills);
2. the drain of 2,000 one-step jobs over 50 keys (keys interleaved) by real prefork
   workers, without a per-key limit and with ``max_running_per_key``, taking turns too.

    python -m bench.per_key [--claims 2000] [--jobs 2000] [--keys 50] [--per-key 2]
        [--rounds 3] [--base ee44da3] [--pg-url …] [--amqp-url …]

A server is needed (PostgreSQL and RabbitMQ; each database made here is dropped at the end).
The command line, the claim loop and the drain are :mod:`bench.claim_cost`'s.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import kinds
from bench.claim_cost import AFTER, BEFORE, bench_parser, compare_claims, drain_rounds
from bench.procs import Processes
from bench.scenarios import REPO
from bench.stats import median


def main() -> None:
    parser = bench_parser(__doc__, base="ee44da3", concurrency=2, keyed_drain=True, skips=True)
    parser.add_argument("--per-key", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-perkey-") as scratch:
        root = Path(scratch)
        if not args.skip_claims:
            sides = {
                "before": (BEFORE, "plain"),
                "after": (AFTER, "plain"),
                "after, keyed": (AFTER, "keyed"),
            }
            compare_claims(args, sides, width=13)
        if args.skip_drain:
            return
        procs = Processes(root / "logs", REPO)
        limits = {"no limit": (kinds.KEYED, None), "per key": (kinds.KEYED, args.per_key)}
        rates = drain_rounds(procs, root, args, limits)
        ratio = median(rates["per key"]) / median(rates["no limit"])
        print(
            f"drain of {args.jobs} jobs over {args.keys} keys, {args.workers} workers x "
            f"{args.concurrency}: no limit {median(rates['no limit']):.1f} jobs/s, "
            f"max_running_per_key={args.per_key} {median(rates['per key']):.1f} jobs/s "
            f"({ratio:.3f} x)"
        )


if __name__ == "__main__":
    main()
