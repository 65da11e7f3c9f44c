"""Running the ``tidemark`` command in tests: in this process (``run_cli``) or as a program (``tidemark``, or
``TIDEMARK`` for a command line of your own)."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Optional

from coordinator.operations.cli import EXIT_ERROR, main

TIDEMARK = [sys.executable, "-m", "coordinator.operations.cli"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``tidemark ARGV...`` in this process: its exit status, stdout and stderr (what was printed before is
    dropped)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tidemark(*argv: str, env: Optional[Mapping[str, str]] = None, timeout: float = 120,
             cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """``tidemark ARGV...`` as a program, with no standard input, its output captured as text."""
    return subprocess.run([*TIDEMARK, *argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def assert_one_line_error(code: int, err: str, *needles: str, status: int = EXIT_ERROR) -> None:
    """The command failed with ``status`` in one ``tidemark: error:`` line containing each of ``needles``; a
    failure (status 1) is not an unexpected one."""
    assert code == status and err.startswith("tidemark: error: ") and err.count("\n") == 1, (code, err)
    if status == EXIT_ERROR:
        assert "unexpected" not in err, err
    for needle in needles:
        assert needle in err, err
