"""Logging for programs built on Tidemark: what a job waits for, takeovers and connection changes, on stderr.

    from coordinator.operations.logs import log_to_stderr
    log_to_stderr()                       # INFO and up from coordinator.* and spark_hooks.*, with the time
    with logging_to_stderr(fmt=...):      # the same for one block (the tidemark command)

The library only creates loggers (``coordinator.<module>``, ``spark_hooks.<module>``) and never
configures the root logger, on import or later: an application decides where logs go. The
``tidemark`` command and ``examples/`` call ``log_to_stderr`` so that waits ("job report waiting
12 s ...: waiting for lake.db.counts ..."), takeovers ("job counts: leading with term 3") and
ZooKeeper connection changes show by default. An application that configures logging itself
(``logging.basicConfig(level=logging.INFO)``) needs none of this.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

LOGGERS = ("coordinator", "spark_hooks")
DEFAULT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a test or a daemon may replace it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def log_to_stderr(level: int = logging.INFO, fmt: str = DEFAULT_FORMAT) -> None:
    """Send Tidemark's own log records at ``level`` and up to stderr for the rest of the process (calling it
    again replaces the level and format). Records still reach the root logger's handlers, if an application
    configured any: such an application needs no call to this."""
    _attach(level, fmt)


@contextmanager
def logging_to_stderr(level: int = logging.INFO, fmt: str = DEFAULT_FORMAT) -> Iterator[None]:
    """``log_to_stderr`` for the duration of the block, then as before (``tidemark``'s commands, which may
    run inside another program's process: tests, a notebook)."""
    before = _attach(level, fmt)
    try:
        yield
    finally:
        for name, (previous_level, handler, added) in before.items():
            logger = logging.getLogger(name)
            logger.setLevel(previous_level)
            if added:
                logger.removeHandler(handler)


def _attach(level: int, fmt: str) -> dict[str, tuple[int, logging.Handler, bool]]:
    """Put one ``_Stderr`` handler on each of ``LOGGERS``; returns, per logger, its former level, the handler
    and whether it was added now."""
    before: dict[str, tuple[int, logging.Handler, bool]] = {}
    for name in LOGGERS:
        logger = logging.getLogger(name)
        handler = next((h for h in logger.handlers if isinstance(h, _Stderr)), None)
        before[name] = (logger.level, handler or _Stderr(), handler is None)
        if handler is None:
            logger.addHandler(before[name][1])
        before[name][1].setFormatter(logging.Formatter(fmt))
        logger.setLevel(level)
    return before


__all__ = ["log_to_stderr", "logging_to_stderr"]
