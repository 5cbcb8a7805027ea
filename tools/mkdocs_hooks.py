"""MkDocs hooks (mkdocs.yml `hooks:`): the generated parts of the pages, at build time.

A page line `<!-- generated: NAME -->` is replaced by `tools.docs_pages.GENERATED[NAME]()`, so
the settings page and the dtype table come from the code that defines them; an unknown NAME
fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

_MARK = re.compile(r"^<!-- generated: (\w+) -->$", re.M)
_REPO = Path(__file__).resolve().parent.parent


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The page's Markdown with every generated marker replaced by its text."""
    if str(_REPO) not in sys.path:
        sys.path.insert(0, str(_REPO))  # mkdocs imports this file by path, not as tools.*
    from tools.docs_pages import GENERATED

    def render(match: re.Match[str]) -> str:
        name = match[1]
        if name not in GENERATED:
            raise ValueError(f"unknown generated part {name!r} (known: {', '.join(GENERATED)})")
        return GENERATED[name]()

    return _MARK.sub(render, markdown)
