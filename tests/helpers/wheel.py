"""The wheel ``python -m build`` makes of this checkout, as a release would build it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_DEADLINE_S = 300


def copy_checkout(target: Path) -> Path:
    """This checkout's sources copied to ``target``, as a clone has them (no venv, build output or caches)."""
    shutil.copytree(ROOT, target, ignore=shutil.ignore_patterns(".*", "build", "dist", "site", "*.egg-info",
                                                                "__pycache__", "helm"))
    return target


def build_wheel(out: Path) -> tuple[Path, str]:
    """Build the wheel into ``out`` from a copy of the sources (the checkout gets no build output), without network
    (``--no-isolation``: the build backend comes from this environment); its path and what the build printed."""
    source = copy_checkout(out / "source")
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=BUILD_DEADLINE_S)
    shutil.rmtree(source)
    (wheel,) = out.glob("tidemark_iceberg-*.whl")  # the wheel's file name normalizes the dashes
    return wheel, done.stdout + done.stderr
