"""The documentation site builds strictly (a broken link or a page out of the nav fails it), its reference pages are
what the code says, and the README stays a landing page that links every page."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers.docs import ROOT, RUNNABLE, blocks, page, pages

README_MAX_LINES = 150


def build(config, site) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_the_readme_as_its_home_page(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Quickstart" in home and 'href="concepts/"' in home, "the home page is not the README, links made relative"
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path):
    """Strict means strict: the same site with one link to a page that does not exist does not build."""
    docs = shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (docs / "concepts.md").write_text(page("concepts.md") + "\nSee [a page](no-such-page.md).\n")
    config = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("  - tools/docs_hooks.py", f"  - {ROOT / 'tools' / 'docs_hooks.py'}")
    (tmp_path / "mkdocs.yml").write_text(config)
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_reference_pages_are_what_the_code_says():
    done = subprocess.run([sys.executable, "-m", "tools.docs_reference", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_readme_is_a_landing_page_that_links_every_page():
    readme = page("README.md")
    assert len(readme.splitlines()) <= README_MAX_LINES, f"README.md is {len(readme.splitlines())} lines"
    linked = set(re.findall(r"\]\(docs/([\w/.-]+\.md)\)", readme))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages - linked == set(), "pages the README does not link"
    assert linked - pages == set(), "README links to pages that do not exist"


@pytest.mark.parametrize("name", sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")))
def test_every_page_has_one_title(name):
    titles = [line for line in re.sub(r"^```.*?^```", "", page(name), flags=re.M | re.S).splitlines()
              if line.startswith("# ")]
    assert len(titles) == 1, f"docs/{name} has the titles {titles}"


def test_every_block_a_reader_runs_is_run_by_a_docs_run_or_says_why_not():
    """Every shell and Python block of the pages names the run of tests/test_quickstart.py that runs it, or says why
    none can; every other block says what it is (its language), so a block a reader runs cannot go unnoticed."""
    from tests.test_quickstart import RUNS
    unmarked, unknown, untyped = [], [], []
    for name in pages():
        for block in blocks(name):
            where = f"{name}: {block.body.splitlines()[0] if block.body else ''}"
            if not block.language:
                untyped.append(where)
            elif block.language in RUNNABLE and not (block.directive == "run" or
                                                     (block.directive == "not run" and block.said.strip())):
                unmarked.append(where)
            unknown += [f"{where} names run {r!r}" for r in block.runs if r not in (*RUNS, "install")]
    assert unmarked == [], "blocks a reader runs that no test runs and that do not say why: <!-- run: ... -->"
    assert unknown == []
    assert untyped == [], "blocks without a language (```text for output and listings)"
    every = {r for name in pages() for block in blocks(name) for r in block.runs}
    borrowing = {name for name, run in RUNS.items() if run.of}  # runs the blocks of others (the newcomer's)
    assert every == {*RUNS, "install"} - borrowing, "a run that runs no block"
    assert all(set(RUNS[name].of) <= every for name in borrowing), "a run borrowing the blocks of a run with none"
