"""ZooKeeper's clock, as the stamps on this process's own writes show it: the one clock every driver shares.

    clock = session.server_clock
    clock.now_ms()      # a time ZooKeeper's clock has reached (this host's wall clock until a write was stamped)
    clock.skew_ms()     # this host's wall clock minus ZooKeeper's (None: no write stamped yet)

The server stamps every znode it changes with its own wall clock (``mtime``: the ensemble leader's
clock, when it took the write). Each multi of the session that changes a znode's data returns that
stamp (``ZooKeeperSession.multi`` calls ``observe``), with the local monotonic times the request was
sent and answered: the stamp was taken in between, so ZooKeeper's time at the midpoint is the stamp,
give or take half the round trip. ``now_ms`` carries the best sample forward with the monotonic
clock: the one whose half round trip, plus ``DRIFT`` of its age (how far two hosts' monotonic clocks
may part), is smallest, so a fresh sample replaces an old one unless it took much longer. It answers
the time less that uncertainty: ZooKeeper's clock has certainly reached it (a barrier is taken only
once it has), and it never steps back. A host's wall clock that is off, or steps (an NTP correction),
changes nothing here, and a leader's write of every epoch keeps it fresh.

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

DRIFT = 1e-4  # how fast this host's monotonic clock may drift from ZooKeeper's: 100 ppm, a poor crystal's


class ServerClock:
    """ZooKeeper's wall clock as the stamps on this session's writes show it, carried forward on the monotonic
    clock from the best sample (``observe``); ``now_ms`` answers a time ZooKeeper's clock has certainly reached,
    never stepping back.

        clock = session.server_clock    # one per ZooKeeperSession, whose multis call observe()
        clock.now_ms()                  # ZooKeeper's time less the estimate's uncertainty, in ms
        clock.skew_ms()                 # this host's wall clock minus ZooKeeper's (None: no stamp yet)

    Znodes: none of its own; it learns from the ``mtime`` stamps the session's multis return. Thread-safe.

    Failure behaviour: nothing here raises or makes a request, and a session loss changes nothing (the best
    sample is kept, its uncertainty growing by ``DRIFT`` of its age). With no stamp yet, ``now_ms`` is this
    host's wall clock and ``skew_ms`` None.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._best: Optional[tuple[float, float, int]] = None  # (half round trip s, monotonic midpoint, stamp ms)
        self._reached_ms = 0  # the latest time answered: never answered less again

    @staticmethod
    def _uncertainty_s(sample: tuple[float, float, int], at_monotonic: float) -> float:
        return sample[0] + DRIFT * max(0.0, at_monotonic - sample[1])

    def observe(self, sent_monotonic: float, answered_monotonic: float, stamp_ms: int) -> None:
        """A write sent and answered at these monotonic times was stamped ``stamp_ms`` by the server."""
        half = (answered_monotonic - sent_monotonic) / 2
        sample = (half, sent_monotonic + half, stamp_ms)
        with self._lock:
            best = self._best
            if best is None or half <= self._uncertainty_s(best, answered_monotonic):
                self._best = sample

    @staticmethod
    def _estimate_ms(sample: tuple[float, float, int], at_monotonic: float, slack_s: float = 0.0) -> int:
        """ZooKeeper's clock at ``at_monotonic`` by ``sample``, less ``slack_s``."""
        return sample[2] + int((at_monotonic - sample[1] - slack_s) * 1000)

    def now_ms(self) -> int:
        """A time ZooKeeper's wall clock has reached, in ms: its clock now less the estimate's uncertainty, never
        less than an earlier answer (this host's wall clock until a write of this session was stamped)."""
        best, now = self._best, time.monotonic()
        if best is None:
            return int(time.time() * 1000)
        reached = self._estimate_ms(best, now, self._uncertainty_s(best, now))
        with self._lock:
            self._reached_ms = max(self._reached_ms, reached)
            return self._reached_ms

    def skew_ms(self) -> Optional[int]:
        """This host's wall clock minus ZooKeeper's, in ms (positive: this host is ahead); None before a stamp."""
        best = self._best
        return None if best is None else int(time.time() * 1000) - self._estimate_ms(best, time.monotonic())


__all__ = ["DRIFT", "ServerClock"]
