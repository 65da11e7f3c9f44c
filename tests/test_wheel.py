"""What ``pip install tidemark`` ships: the two packages and the console script, no development tooling."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Everything of the clone the build may read; caches and the venv only slow the copy down.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
                                     ".hypothesis")


def test_the_wheel_holds_the_packages_and_the_console_script_and_no_dev_tooling(tmp_path):
    # A copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    # No isolation: the build backend (setuptools) comes from the dev extra, no download needed.
    result = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                             str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tidemark-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {"coordinator", "spark_hooks"} <= tops
    assert {"tests", "bench", "tools", "examples"}.isdisjoint(tops), sorted(tops)
    assert "coordinator/operations/cli.py" in names and "spark_hooks/session.py" in names
    assert not [n for n in names if n.endswith(("/demo.py", "/jars.py"))], "the demo or the jar installer shipped"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[console_scripts]" in scripts and "tidemark = coordinator.operations.cli:main" in scripts
