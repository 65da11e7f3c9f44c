"""The documentation says true things about the project's own commands: every benchmark suite, `python -m bench
--help`, and one figure for how long `make test` takes."""
from __future__ import annotations

import re
import subprocess
import sys

from bench.__main__ import SUITES
from tests.helpers.docs import ROOT, page

README = page("README.md")


def test_the_readme_lists_every_benchmark_suite_and_bench_help_works():
    listed = re.findall(r"^\| `(\w+)` \|", page("contributing/benchmarks.md"), re.M)
    assert listed == list(SUITES), f"README's suites {listed} are not bench's {list(SUITES)}"
    done = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in SUITES)
    for name in SUITES:  # "python -m bench SUITE --help a suite's options"
        done = subprocess.run([sys.executable, "-m", "bench", name, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m bench {name}"), done.stderr


def test_the_readme_gives_one_duration_for_make_test():
    docs = README + page("contributing/development.md")
    durations = set(re.findall(r"make test\b[^`\n]*?\(about (\d+) minutes\)", docs))
    durations |= set(re.findall(r"about (\d+)\s+minutes for `make test`", docs))
    assert len(durations) == 1, f"README gives make test several durations: {sorted(durations)} minutes"
