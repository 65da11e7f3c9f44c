"""What `pip install tidemark-iceberg` ships: the two packages and the console script, no dev tooling.

The wheel is built with `python -m build`, as a release is, and read back. The distribution's name is
ours on PyPI (`tidemark` is another project's): the README installs it by that name.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = "tidemark-iceberg"


def test_the_wheel_ships_the_library_and_the_command_and_no_dev_tooling(tmp_path):
    source = tmp_path / "source"  # a copy of what a release builds from, so the checkout gets no build output
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "helm"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path),
                    str(source)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = tmp_path.glob("tidemark_iceberg-*.whl")  # the wheel's file name normalizes the dashes
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    (dist_info,) = {top for top in tops if top.endswith(".dist-info")}
    assert tops == {"coordinator", "spark_hooks", dist_info}
    assert "coordinator/tidemark.py" in names and "spark_hooks/session.py" in names
    assert not [n for n in names if n.endswith(("demo.py", "jars.py")) or "/tests/" in n], "dev tooling in the wheel"
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "tidemark = coordinator.operations.cli:main" in entry_points
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert f"\nName: {DIST}\n" in metadata and "\nProvides-Extra: readers\n" in metadata


def test_the_distribution_is_named_what_the_readme_installs_and_the_readers_are_an_extra():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^name = "{DIST}"$', pyproject, re.M)
    readers = re.search(r"^readers = \[(.*)\]$", pyproject, re.M)
    assert readers, "pyproject.toml has no readers extra"
    assert {"pandas", "polars", "duckdb"} <= set(re.findall(r'"([a-z]+)', readers.group(1)))
    readme = (ROOT / "README.md").read_text()
    installs = re.findall(r"pip install (?:-e )?'?([\w.-]+)(?:\[[\w,]+\])?'?", readme)
    assert installs, "the README installs nothing"
    assert set(installs) <= {DIST, "."}, f"the README installs {sorted(set(installs))}, not {DIST}"
    assert re.search(r"pip install (-e )?'?\.(\[[\w,]+\])?'?", readme), "the README does not say how to install a clone"
    assert readme.index(f"pip install '{DIST}") < readme.index("\n## "), "the README's first lines do not install it"
