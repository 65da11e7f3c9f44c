"""ZooKeeper's clock, as the stamps on this process's own writes show it: the one clock every driver shares.

    clock = session.server_clock
    clock.now_ms()      # ZooKeeper's time now (this host's wall clock until a write was stamped)
    clock.skew_ms()     # this host's wall clock minus ZooKeeper's (None: no write stamped yet)

The server stamps every znode it changes with its own wall clock (``mtime``: the ensemble leader's
clock, when it took the write). Each multi of the session that changes a znode's data returns that
stamp (``ZooKeeperSession.multi`` calls ``observe``), with the local monotonic times the request was
sent and answered: the stamp was taken in between, so ZooKeeper's time at the midpoint is the stamp,
give or take half the round trip. ``now_ms`` carries the best recent sample (the shortest round trip
of the last ``SAMPLE_TTL_S``) forward with the monotonic clock, so a host's wall clock that is off,
or steps (an NTP correction), changes nothing here, and a leader's write of every epoch keeps it fresh.

Why: a root job takes the newest barrier the clock has passed by its grace. On a driver's own clock,
one 30 s ahead would take barriers ZooKeeper's clock (and every other driver's) reaches 30 s later,
and its lag figures would be 30 s wrong; on this clock it paces as every other driver does
(``docs/design.md``, "Clocks").

Failure behaviour: nothing here raises or makes a request. With no stamp yet, it is this host's
wall clock; ``skew_ms`` says None then.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

SAMPLE_TTL_S = 60.0  # a sample is replaced by a newer one with a longer round trip once it is this old


class ServerClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._best: Optional[tuple[float, float, int]] = None  # (half round trip s, monotonic midpoint, stamp ms)

    def observe(self, sent_monotonic: float, answered_monotonic: float, stamp_ms: int) -> None:
        """A write sent and answered at these monotonic times was stamped ``stamp_ms`` by the server."""
        half = (answered_monotonic - sent_monotonic) / 2
        sample = (half, sent_monotonic + half, stamp_ms)
        with self._lock:
            best = self._best
            if best is None or half <= best[0] or answered_monotonic - best[1] > SAMPLE_TTL_S:
                self._best = sample

    def now_ms(self) -> int:
        """ZooKeeper's wall clock now, in ms (this host's until a write of this session was stamped)."""
        best = self._best
        if best is None:
            return int(time.time() * 1000)
        return best[2] + int((time.monotonic() - best[1]) * 1000)

    def skew_ms(self) -> Optional[int]:
        """This host's wall clock minus ZooKeeper's, in ms (positive: this host is ahead); None before a stamp."""
        if self._best is None:
            return None
        return int(time.time() * 1000) - self.now_ms()

    def uncertainty_ms(self) -> Optional[int]:
        """How far ``now_ms`` may be off (half the sample's round trip); None before a stamp."""
        best = self._best
        return None if best is None else int(best[0] * 1000) + 1


__all__ = ["SAMPLE_TTL_S", "ServerClock"]
