"""A wrong wall clock for a real process (Python and its JVM alike): ``skewclock.c`` preloaded.

    clock = SkewedClock(tmp_path, offset_ms=30_000)    # builds the library once per directory
    subprocess.Popen(argv, env={**os.environ, **clock.env()})
    clock.set(-10_000)                                  # steps the process's clock, as NTP would

Only the wall clock is off; the monotonic clock and sleeps stay real (see ``skewclock.c``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("skewclock.c")


class SkewedClock:
    def __init__(self, directory: Path, offset_ms: int = 0) -> None:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise RuntimeError("the clock tests need a C compiler (make setup installs gcc and libc6-dev)")
        self.library = directory / "skewclock.so"
        self.offset_file = directory / "skewclock.offset"
        if not self.library.is_file():
            subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(self.library), str(SOURCE), "-ldl"],
                           check=True, capture_output=True, text=True)
        self.set(offset_ms)

    def set(self, offset_ms: int) -> None:
        """The process's wall clock is ``offset_ms`` off from now on (within 50 ms): replaced at once, never torn."""
        staged = self.offset_file.with_suffix(".next")
        staged.write_text(f"{offset_ms}\n")
        os.replace(staged, self.offset_file)

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "SKEWCLOCK_FILE": str(self.offset_file)}
