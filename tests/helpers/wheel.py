"""The wheel ``python -m build`` makes of this checkout, as a release would build it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_DEADLINE_S = 300


def build_wheel(out: Path) -> tuple[Path, str]:
    """Build the wheel into ``out`` from a copy of the sources (the checkout gets no build output), without network
    (``--no-isolation``: the build backend comes from this environment); its path and what the build printed."""
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__",
                                                                "helm"))
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=BUILD_DEADLINE_S)
    shutil.rmtree(source)
    (wheel,) = out.glob("tidemark_iceberg-*.whl")  # the wheel's file name normalizes the dashes
    return wheel, done.stdout + done.stderr
