"""The one compare-and-set retry loop (``coordinator.zookeeper.races``): an attempt that lost its race is run again
until the deadline, counted under the caller's operation, then ``ZooKeeperUnavailable`` says the caller's message.
No ZooKeeper server: a session over a stand-in client that never makes a request.
"""
from __future__ import annotations

import time

import pytest

from coordinator.errors import ZooKeeperUnavailable
from coordinator.protocol.registry import TermMoved, retry_term_change
from coordinator.zookeeper.races import Raced, retry_races
from coordinator.zookeeper.session import ZooKeeperSession
from tests.helpers.stand_in_client import StandInClient


def lose() -> None:
    raise Raced()


@pytest.fixture
def session():
    tm = ZooKeeperSession(StandInClient(), operation_timeout=0.5)
    yield tm
    tm.close()


def test_a_lost_race_is_decided_again_and_counted_under_the_callers_operation(session):
    tries = []

    def attempt() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise Raced()
        return "won"
    assert session.retry_races("never said", attempt, counter="barriers") == "won"
    assert len(tries) == 3 and session.retry_counts() == {"barriers": 2}


def test_at_the_deadline_the_callers_message_is_raised_and_no_attempt_starts_after_it(session, monkeypatch):
    clock = [1000.0]  # tenacity's clock, advanced by its sleeps alone: a loaded machine wakes a sleeper late
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    started: list[float] = []

    def attempt() -> None:
        started.append(time.monotonic())
        raise TermMoved()  # a Raced: what registry and rest raise when a job's term moved
    begun = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match=r"^fencing job 'a' kept racing with its leader elections for 0s"):
        retry_term_change(session, "fencing job 'a'", attempt)
    assert len(started) > 1 and started[-1] - begun < 0.5
    assert session.retry_counts() == {"registration": len(started) - 1}


def test_any_other_error_ends_it_at_once_and_uncounted_retries_are_not_counted(session):
    def attempt() -> None:
        raise ZooKeeperUnavailable("down")
    with pytest.raises(ZooKeeperUnavailable, match=r"^down$"):
        session.retry_races("never said", attempt, counter="registration")
    with pytest.raises(ZooKeeperUnavailable, match=r"^changing$"):
        session.retry_races("changing", lose)
    assert session.retry_counts() == {}


def test_the_loop_needs_no_session():
    calls = []
    with pytest.raises(ZooKeeperUnavailable, match=r"^gave up$"):
        retry_races(lose, deadline=0.1, message="gave up",
                    on_retry=lambda state: calls.append(state.attempt_number))
    assert calls == list(range(1, len(calls) + 1)) and calls
