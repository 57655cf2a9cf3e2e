"""Carry README.md / deploy/*.md changes made since BASE into the docs/ pages they moved to.

    .venv/bin/python docs/port_readme.py BASE [TARGET]   # TARGET defaults to main

Each hunk of ``git diff BASE TARGET -- README.md deploy/README.md deploy/SIZING.md`` whose
old text appears on exactly one page is applied there; a hunk already applied is skipped, and
every other hunk is printed for a person to place (a moved section, a generated table). Links
of the form ``(#anchor)`` in carried text still point into the README: ``make docs`` names
each one that no longer resolves.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("README.md", "deploy/README.md", "deploy/SIZING.md")


def hunks(base: str, target: str, source: str) -> list[tuple[str, str, str]]:
    """(old text, new text, raw hunk) of every hunk of ``source`` from base to target."""
    diff = subprocess.run(
        ["git", "diff", "-U2", base, target, "--", source],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = []
    for hunk in re.split(r"^@@.*@@.*\n", diff, flags=re.M)[1:]:
        old, new = [], []
        for line in hunk.splitlines():
            tag, text = line[:1], line[1:]
            if tag in " -":
                old.append(text)
            if tag in " +":
                new.append(text)
        found.append(("\n".join(old), "\n".join(new), hunk))
    return found


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    base, target = argv[0], argv[1] if len(argv) == 2 else "main"
    pages = {path: path.read_text() for path in (ROOT / "docs").rglob("*.md")}
    pages[ROOT / "CONTRIBUTING.md"] = (ROOT / "CONTRIBUTING.md").read_text()
    left = 0
    for source in SOURCES:
        for old, new, hunk in hunks(base, target, source):
            if any(new in text for text in pages.values()):
                continue  # already carried
            holders = [path for path, text in pages.items() if old in text]
            if len(holders) == 1:
                pages[holders[0]] = pages[holders[0]].replace(old, new, 1)
                print(f"carried a hunk of {source} to {holders[0].relative_to(ROOT)}")
            else:
                left += 1
                print(f"--- place by hand ({source}):\n{hunk}")
    for path, text in pages.items():
        if path.read_text() != text:
            path.write_text(text)
    print(f"{left} hunk(s) to place by hand")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
