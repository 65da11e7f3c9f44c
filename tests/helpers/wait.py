"""Waiting in tests: poll a condition until it holds, with a deadline (never a fixed sleep)."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.05,
             seen: Optional[Callable[[], str]] = None) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); fail naming ``what`` after ``timeout``, and
    what ``seen`` says was there then (what was seen, not a guess at why)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f"; seen: {seen()}" if seen is not None else ""))
        time.sleep(every)
