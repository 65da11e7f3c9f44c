"""What `pip install tidemark-iceberg` ships: the two packages and the console script, no dev tooling.

The wheel is built with `python -m build`, as a release is, and read back. The distribution's name is
ours on PyPI (`tidemark` is another project's): the README installs it by that name.
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

from tests.helpers.docs import section
from tests.helpers.wheel import build_wheel

ROOT = Path(__file__).resolve().parent.parent
DIST = "tidemark-iceberg"


def test_the_wheel_ships_the_library_and_the_command_and_no_dev_tooling(tmp_path):
    wheel, log = build_wheel(tmp_path)
    assert "deprecat" not in log.lower(), f"the build warns of a deprecation:\n{log}"
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
    installs = re.findall(r"pip install (?:-e )?'?([\w./-]+?)(?:\[[\w,]+\])?'?(?:\s|$)", readme)
    assert installs, "the README installs nothing"
    wheels = {i for i in installs if i.endswith(".whl")}
    assert all(re.fullmatch(rf"dist/{DIST.replace('-', '_')}-[\w.]+-py3-none-any\.whl", w) for w in wheels), wheels
    # One way in, until a release is on PyPI: the wheel built from a clone (a PyPI line would fail as written).
    assert set(installs) - wheels == {"build"}, f"the README installs {sorted(set(installs))}, not {DIST}'s wheel"
    assert "python -m build --wheel" in section(readme, "Install"), "the README does not say how to build the wheel"
