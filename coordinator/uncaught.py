"""One line for a Tidemark error that a user's script does not catch, as the ``tidemark`` command prints it.

    report_uncaught_errors()     # EpochWriter and EpochJob call it; calling it again changes nothing

An uncaught ``TidemarkError`` in a driver or a plain-Python job prints ``tidemark: error: <message>`` on stderr (the
status stays 1, as for any uncaught exception) instead of a traceback through Tidemark's internals: the message
says what is wrong and what to do. With ``TIDEMARK_DEBUG=1``, or the ``coordinator`` logger at DEBUG, the
traceback is printed as Python prints it. Any other exception goes to the hook that was there before.

Part of the foundation layer: imports nothing of the package but its errors and settings.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, Optional

from coordinator.errors import TidemarkError
from coordinator.settings import Settings


def error_line(message: str) -> str:
    """``tidemark: error: <message>``, on one line: what the CLI and an uncaught error in a script print."""
    return "tidemark: error: " + " ".join(message.split())  # every line break Python knows is whitespace to split()


def debugging() -> bool:
    """True when the traceback was asked for: ``TIDEMARK_DEBUG`` set (not ``0``), or Tidemark's logger at DEBUG."""
    try:
        asked = Settings.from_env().debug
    except TidemarkError:  # another variable is unusable: its own error says so, this one is not asked for
        asked = False
    return asked or logging.getLogger("coordinator").isEnabledFor(logging.DEBUG)


class _OneLineHook:
    """``sys.excepthook``: a ``TidemarkError`` as one line, anything else to the hook it replaced."""

    def __init__(self, previous: Callable[[type[BaseException], BaseException, Optional[TracebackType]], Any]) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        if isinstance(value, TidemarkError) and not debugging():
            print(error_line(str(value)), file=sys.stderr)
            return
        self.previous(kind, value, tb)


def report_uncaught_errors() -> None:
    """Install the one-line hook (module docstring), once per interpreter."""
    if not isinstance(sys.excepthook, _OneLineHook):
        sys.excepthook = _OneLineHook(sys.excepthook)
