"""``python -m jobs``: the same command line as ``jobctl``."""

from jobs.cli import main

main(prog_name="jobctl")
