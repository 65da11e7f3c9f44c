"""How Tidemark writes times, epochs and durations for people: one home for the CLI, status, pacing and versions.

    fmt_time(1767225605000)      # "00:00:05Z"
    fmt_epoch(1767225605000)     # "1767225605000 (00:00:05Z)"
    fmt_every(3_600_000)         # "1h" (parse_every in coordinator.protocol.pacing reads it back)
    fmt_age(93_784_000)          # "1d 2h 3m"

Part of the foundation layer: imports nothing of the package.
"""
from __future__ import annotations

import time
from typing import Optional

# The units of a length as written (``every="1h"``, ``--for 2h``): parse_every reads them, fmt_every writes them.
UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def fmt_time(epoch: Optional[int]) -> str:
    """``10:00:05Z`` (``10:00:05.200Z`` for an epoch that is not a whole second), ``-`` for None."""
    if epoch is None:
        return "-"
    text = time.strftime("%H:%M:%S", time.gmtime(epoch // 1000))
    return f"{text}.{epoch % 1000:03d}Z" if epoch % 1000 else f"{text}Z"


def fmt_epoch(epoch: Optional[int]) -> str:
    """The epoch and its time of day: ``1767225605000 (00:00:05Z)``; ``-`` for None."""
    return "-" if epoch is None else f"{epoch} ({fmt_time(epoch)})"


def fmt_seconds(ms: Optional[int]) -> str:
    """Milliseconds as seconds to a tenth: ``41.0 s``; ``-`` for None."""
    return "-" if ms is None else f"{ms / 1000:.1f} s"


def fmt_every(every_ms: int) -> str:
    """``3600000`` -> ``"1h"``: the largest unit that divides it."""
    for unit in ("d", "h", "m", "s"):
        if every_ms % UNITS_MS[unit] == 0:
            return f"{every_ms // UNITS_MS[unit]}{unit}"
    return f"{every_ms}ms"


def fmt_cadence(ms: Optional[int]) -> str:
    """A cadence as ``fmt_every`` writes it; ``-`` for None."""
    return "-" if ms is None else fmt_every(ms)


def fmt_age(ms: int) -> str:
    """``93784000`` -> ``1d 2h 3m``."""
    minutes = max(ms, 0) // 60_000
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    return " ".join(f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (minutes, "m")) if v) or "0m"


def fmt_duration(ms: int) -> str:
    """Whole seconds under a minute (``42 s``), else as ``fmt_age``."""
    return f"{ms // 1000} s" if ms < 60_000 else fmt_age(ms)
