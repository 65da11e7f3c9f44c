"""The environment of a driver process that kills itself at a crash point (coordinator/crashpoints.py)."""
from __future__ import annotations

import os

from coordinator.crashpoints import ENV


def crash_env(crash_at: str, nth: int = 2) -> dict[str, str]:
    """This process's environment with ``TIDEMARK_CRASH_AT=<crash_at>:<nth>`` (the kill tests' drivers die in
    their second computed epoch: each step is reached once per computed epoch, idle epochs reach none of
    them), or without it for ``none``."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if crash_at != "none":
        env[ENV] = f"{crash_at}:{nth}"
    return env
