"""The documentation as the tests read it: README.md (the landing page) and the pages in docs/.

    page("reading.md")                  # a page's text (README.md: "README.md")
    section(page("README.md"), "Quickstart")   # from "## Quickstart" to the next "## " heading
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def page(name: str) -> str:
    return (ROOT / name if name == "README.md" else ROOT / "docs" / name).read_text()


def section(text: str, title: str, level: int = 2) -> str:
    """The section under ``title`` (a heading of ``level``), to the next heading of that level or the end."""
    marks = "#" * level
    start = text.index(f"\n{marks} {title}\n") if not text.startswith(f"{marks} {title}\n") else 0
    end = text.find(f"\n{marks} ", start + 1)
    return text[start:end if end >= 0 else len(text)]
