"""The documentation as the tests read it: README.md (the landing page) and the pages in docs/.

    page("reading.md")                  # a page's text (README.md: "README.md")
    section(page("README.md"), "Quickstart")   # from "## Quickstart" to the next "## " heading
    blocks("spark.md")                  # its fenced blocks, each with the line before it says of it

Every shell and Python block a reader is meant to run says, on the line before it, which of the runs of
``tests/test_quickstart.py`` runs it (``<!-- run: spark -->``, several separated by commas, ``in the background``
for a server) or why none can (``<!-- not run: needs a Kubernetes cluster -->``); ``tests/test_docs.py`` checks that
every one does.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
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


FENCE = re.compile(r"(?:^ *<!-- (run|not run): (.+?) -->\n)?^( *)```(\w*)\n(.*?)^\3```", re.M | re.S)
RUNNABLE = ("sh", "python")  # the languages of blocks a reader runs
BACKGROUND = "in the background"  # a run's block that starts a server: the run goes on beside it


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, its text, and whether and where the tests run it."""

    page: str
    language: str
    body: str
    directive: str  # "run", "not run", or "" (none)
    said: str  # the runs named (comma separated, maybe "in the background"), or why none

    @property
    def runs(self) -> list[str]:
        if self.directive != "run":
            return []
        return [r.strip() for r in self.said.removesuffix(BACKGROUND).split(",") if r.strip()]

    @property
    def in_background(self) -> bool:
        return self.directive == "run" and self.said.endswith(BACKGROUND)

    @property
    def saved_as(self) -> str | None:
        """The file a Python block is saved as (its first line: ``# <file>.py: ...``); None: run where it stands."""
        found = re.match(r"# ([\w.-]+\.py)\b", self.body)
        return found.group(1) if found else None


def blocks(name: str) -> list[Block]:
    return [Block(name, language, textwrap.dedent(body), directive, said)
            for directive, said, _, language, body in FENCE.findall(page(name))]  # a list item's blocks are indented


def pages() -> list[str]:
    """The pages a reader reads (README.md and docs/, not the generated reference nor the design of record)."""
    found = ["README.md"] + sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    return [p for p in found if not p.startswith("reference/") and p != "design.md"]
