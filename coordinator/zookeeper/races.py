"""Compare-and-set, retried: the one loop for a version-checked write (or a consistent read) that lost a race with
another writer. An attempt raises ``Raced``; ``retry_races`` decides again after a jittered backoff until its
deadline (the session's ``operation_timeout``: ``ZooKeeperSession.retry_races``), then raises
``ZooKeeperUnavailable`` with the caller's message.
"""
from __future__ import annotations

from typing import Callable, Optional, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_before_delay, wait_random_exponential

from coordinator.errors import ZooKeeperUnavailable

T = TypeVar("T")
# Whoever won the race has just written: decide again soon, spread out so that the racers do not meet again.
RACE_WAIT = wait_random_exponential(multiplier=0.01, max=0.2)


class Raced(Exception):
    """A compare-and-set lost a race (the znode's version moved between the read and the conditional write), or a
    read that must be consistent saw a change under it: read and decide again. Raised by an attempt that
    ``retry_races`` runs, never past it."""


def retry_races(attempt: Callable[[], T], *, deadline: float, message: str,
                on_retry: Optional[Callable[[RetryCallState], None]] = None) -> T:
    """Run ``attempt`` again while it raises ``Raced``, after a jittered backoff (``RACE_WAIT``), starting none
    that the deadline would interrupt. It sleeps: never run it on kazoo's event thread (a watch or a state
    listener).

    :param deadline: seconds from the first attempt after which none starts.
    :param message: what the ``ZooKeeperUnavailable`` says: what kept racing, and what to do.
    :param on_retry: a tenacity ``before_sleep`` hook, called before each retry (``Calls.count_retries``).
    :raises ZooKeeperUnavailable: the attempt still lost its race at the deadline.
    """
    retrying = Retrying(stop=stop_before_delay(deadline), wait=RACE_WAIT, retry=retry_if_exception_type(Raced),
                        reraise=True, before_sleep=on_retry)
    try:
        return retrying(attempt)
    except Raced:
        raise ZooKeeperUnavailable(message) from None


__all__ = ["RACE_WAIT", "Raced", "retry_races"]
