"""The user documentation as one text: README.md, then every page under docs/ (sorted).

Tests that check what the docs name (config keys, stack outputs, units, JSON keys) read this, so
a fact may live on whichever page covers its topic; ``section`` finds a titled section on any page.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC_PATHS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))


def user_docs_text() -> str:
    """README.md and docs/*.md joined by blank lines (str)."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in DOC_PATHS)


def section(title: str) -> str:
    """The body of the Markdown section headed ``title`` (any level, any page) up to the next
    heading of the same or a higher level.

    Raises:
        AssertionError: no page has that heading.
    """
    for path in DOC_PATHS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            hashes = line.split(" ", 1)[0]
            if set(hashes) == {"#"} and line[len(hashes) + 1:] == title:
                body = []
                for nxt in lines[i + 1:]:
                    h = nxt.split(" ", 1)[0]
                    if set(h) == {"#"} and len(h) <= len(hashes):
                        break
                    body.append(nxt)
                return "\n".join(body)
    raise AssertionError(f"no page of the docs has a section titled {title!r}")
