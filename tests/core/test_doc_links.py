"""Every relative link in the README and the design notes names a file that exists, and a
`file.md#anchor` link a heading of that file."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/design.md", "docs/decisions.md", "docs/pages.md")


def slugs(md: Path) -> set:
    """GitHub's anchors for a Markdown file's headings."""
    heads = re.findall(r"^#+ (.*)$", md.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_relative_link_resolves():
    bad, seen = [], 0
    for doc in DOCS:
        path = ROOT / doc
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            seen += 1
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve()
            if not resolved.exists():
                bad.append(f"{doc}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in slugs(resolved):
                bad.append(f"{doc}: {target} (no such heading)")
    assert seen > 5, seen  # the scan reads the links
    assert not bad, f"links that resolve to nothing: {bad}"
