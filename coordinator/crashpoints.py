"""Crash points: make a process die at one step of the epoch protocol or of GC, chosen from the environment.

    TIDEMARK_CRASH_AT=precommitted      SIGKILL this process the first time it reaches "precommitted"
    TIDEMARK_CRASH_AT=staged:3          ... the third time it reaches "staged"

Fault tests start a real driver (or ``tidemark gc``) process with this variable set; nothing is
monkeypatched. The writer and the garbage collector call ``crash_point(step)`` at each step below.
Unset (the normal case), a call costs one comparison. When the point is reached the process
writes one line to stderr, ``tidemark: crash point <step>#<nth> reached at <wall ms>: SIGKILL``,
so a test knows when it died, and then kills itself with SIGKILL: no ``finally``, no ``atexit``,
no flushed buffers, as a ``kill -9`` or a lost node would.

The steps, in the order an epoch reaches them:

- ``begin``: the epoch's inputs are recorded (STARTED), before computing;
- ``staged-one``: the first of several sinks staged (its files written, with no catalog commit), the others not;
- ``staged``: every sink is staged, nothing precommitted;
- ``precommitted``: the staged snapshots are recorded, nothing published;
- ``published-one``: the first sink is published (with several sinks, the others are not yet);
- ``committed``: the ZooKeeper commit is done, the Iceberg committed-epoch marks are not;
- ``idle-commit``: an idle epoch's ZooKeeper commit is done, its Iceberg marks are not.

And after them, on a marker round only:

- ``marked``: the committed-epoch marks of a marker round are done (an epoch that marked nothing skips it).

And in a garbage collection:

- ``gc-expired``: a table's expiry commit is done, the files only its expired snapshots referenced
  are not deleted (they are orphans from then on: ``tidemark gc --orphans`` removes them).

An unknown step or a malformed count in the variable raises ``ConfigurationError`` at the first
step the process reaches, so a typo in a test never passes silently.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.settings import Settings

ENV = "TIDEMARK_CRASH_AT"
EPOCH_STEPS = ("begin", "staged-one", "staged", "precommitted", "published-one", "committed", "idle-commit")
MARKER_STEPS = ("marked",)  # not every epoch: a marker round's (an epoch whose sinks all published has none)
GC_STEPS = ("gc-expired",)
STEPS = EPOCH_STEPS + MARKER_STEPS + GC_STEPS

_lock = threading.Lock()
_target: Optional[tuple[str, int]] = None
_parsed = False
_reached = 0


def parse(value: str) -> tuple[str, int]:
    """``<step>[:<nth>]`` as ``(step, nth)``; ``ConfigurationError`` naming what is wrong."""
    step, _, nth = value.strip().partition(":")
    if step not in STEPS:
        raise ConfigurationError(f"{ENV}={value!r}: unknown step {step!r}; the steps are {', '.join(STEPS)}")
    if not nth:
        return step, 1
    if not nth.isdigit() or int(nth) < 1:
        raise ConfigurationError(f"{ENV}={value!r}: the count after ':' must be a positive integer")
    return step, int(nth)


def crash_point(step: str) -> None:
    """Die here with SIGKILL if ``TIDEMARK_CRASH_AT`` names this step and this is its nth time."""
    global _target, _parsed, _reached
    if _parsed and _target is None:
        return
    with _lock:
        if not _parsed:
            value = Settings.from_env().crash_at
            _target = parse(value) if value else None
            _parsed = True
        if _target is None or _target[0] != step:
            return
        _reached += 1
        if _reached < _target[1]:
            return
    print(f"tidemark: crash point {step}#{_reached} reached at {int(time.time() * 1000)}: SIGKILL",
          file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
