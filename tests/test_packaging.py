"""What `pip install tidemark` ships: the two packages and the console script, no dev tooling.

The wheel is built with `python -m build`, as a release is, and read back.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_the_library_and_the_command_and_no_dev_tooling(tmp_path):
    source = tmp_path / "source"  # a copy of what a release builds from, so the checkout gets no build output
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "helm"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path),
                    str(source)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = tmp_path.glob("tidemark-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    (dist_info,) = {top for top in tops if top.endswith(".dist-info")}
    assert tops == {"coordinator", "spark_hooks", dist_info}
    assert "coordinator/tidemark.py" in names and "spark_hooks/session.py" in names
    assert not [n for n in names if n.endswith(("demo.py", "jars.py")) or "/tests/" in n], "dev tooling in the wheel"
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "tidemark = coordinator.operations.cli:main" in entry_points
