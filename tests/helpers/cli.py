"""Running the ``tidemark`` command in tests: in this process (``run_cli``) or as a program (``TIDEMARK``)."""
from __future__ import annotations

import sys

from coordinator.operations.cli import EXIT_ERROR, main

TIDEMARK = [sys.executable, "-m", "coordinator.operations.cli"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``tidemark ARGV...`` in this process: its exit status, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str, status: int = EXIT_ERROR) -> None:
    """The command failed with ``status`` in one ``tidemark: error:`` line containing each of ``needles``; a
    failure (status 1) is not an unexpected one."""
    assert code == status and err.startswith("tidemark: error: ") and err.count("\n") == 1, (code, err)
    if status == EXIT_ERROR:
        assert "unexpected" not in err, err
    for needle in needles:
        assert needle in err, err
