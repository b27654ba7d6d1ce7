"""The page guide (docs/pages.md): what each page shows and how to read it, one section a page.
Each page opens its own section under its heading (widgets.header); the README lists the pages
in one line each and points here."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Dict

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "pages.md"


@functools.lru_cache(maxsize=1)
def sections() -> Dict[str, str]:
    """The guide's sections by the page's sidebar title ("Start here" -> its Markdown)."""
    try:
        text = GUIDE.read_text(encoding="utf-8")
    except OSError:
        return {}
    out = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        m = re.match(r"(.+?) \(`/[^`]*`\)\s*$", head)
        if m:
            out[m.group(1)] = body.strip()
    return out


def section(title: str) -> str:
    """The guide's section for the page titled `title` in the sidebar, or '' where it has none."""
    return sections().get(title, "")
