"""MkDocs hook: puts each table of ``docs/gen_reference.py`` where a page says
``<!-- gen:NAME -->``, and fails the strict build on an incomplete table."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_reference

log = logging.getLogger("mkdocs.plugins.gen_reference")
MARKER = re.compile(r"<!-- gen:(\w+) -->")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        make = gen_reference.TABLES.get(name)
        if make is None:
            log.warning("%s: no generated table named %r", page.file.src_path, name)
            return match.group(0)
        problems: list[str] = []
        text = make(problems)
        for problem in problems:
            log.warning("%s: %s", page.file.src_path, problem)
        return text

    return MARKER.sub(table, markdown)
