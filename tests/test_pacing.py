"""The pacing rule as pure logic (no ZooKeeper): which barrier a job takes next, cadences, common epochs."""
from __future__ import annotations

import pytest

from coordinator import ConfigurationError
from coordinator.formatting import fmt_every
from coordinator.protocol.barriers import BarrierGrid
from coordinator.protocol.held_epochs import newest_common_epoch
from coordinator.protocol.pacing import Pacing, effective_cadences, parse_every
from coordinator.protocol.topology import Topology
from coordinator.records import JobRecord, TableTidemark

GRID = BarrierGrid(1000)


def mark(table: str, *epochs: int) -> TableTidemark:
    result = TableTidemark(table)
    for e in epochs:
        result = result.advanced(e, e // 10, e)
    return result


def test_durations_parse_and_print():
    assert [parse_every(v) for v in ("30s", "5m", "1h", "1d", "250ms", 4000, None)] == \
        [30_000, 300_000, 3_600_000, 86_400_000, 250, 4000, None]
    for bad in ("", "1 week", "-1s", "0s", 0, -5, True, "1.5h"):
        with pytest.raises(ConfigurationError):
            parse_every(bad)
    assert [fmt_every(v) for v in (3_600_000, 90_000, 1500, 86_400_000)] == ["1h", "90s", "1500ms", "1d"]


def test_a_root_job_takes_the_newest_barrier_the_clock_passed_by_the_grace_on_its_cadence():
    pacing = Pacing(grace_ms=300)
    assert pacing.choose(GRID, after=5000, sources={}, has_root_source=True, now=12_299).epoch == 11_000
    assert pacing.choose(GRID, after=5000, sources={}, has_root_source=True, now=12_300).epoch == 12_000
    waiting = pacing.choose(GRID, after=12_000, sources={}, has_root_source=True, now=12_500)
    assert waiting.epoch is None and waiting.wake_in_s == pytest.approx(0.8) and "grace" in waiting.reason
    assert pacing.choose(GRID, after=5000, sources={}, has_root_source=True, now=20_000, until=8500).epoch == 8000
    hourly = Pacing(every_ms=4000, grace_ms=0)
    assert hourly.choose(GRID, after=None, sources={}, has_root_source=True, now=11_999).epoch == 8000
    with pytest.raises(ConfigurationError, match="multiple"):
        Pacing(every_ms=1500).check(GRID, 0)


def test_a_derived_job_takes_the_newest_epoch_every_managed_source_holds_on_its_cadence():
    a, b = mark("a", 1000, 2000, 3000, 4000, 5000), mark("b", 1000, 3000, 4000, 6000)
    pacing = Pacing()
    choice = pacing.choose(GRID, after=1000, sources={"a": a, "b": b}, has_root_source=False, now=10**9)
    assert choice.epoch == 4000, "the newest epoch both hold, coalescing 2000 and 3000"
    assert Pacing(every_ms=3000).choose(GRID, after=1000, sources={"a": a, "b": b}, has_root_source=False,
                                        now=10**9).epoch == 3000
    assert pacing.choose(GRID, after=1000, sources={"a": a, "b": b}, has_root_source=False, now=10**9,
                         until=3500).epoch == 3000
    # With a root source too, the clock bounds it (the root source is cut by commit time).
    assert pacing.choose(GRID, after=1000, sources={"a": a}, has_root_source=True, now=4100).epoch == 3000
    behind = pacing.choose(GRID, after=5000, sources={"a": a, "b": b}, has_root_source=False, now=10**9)
    assert behind.epoch is None and behind.behind == ("a",) and "source a is at epoch 5000" in behind.reason
    missing = pacing.choose(GRID, after=None, sources={"a": a, "b": None}, has_root_source=False, now=10**9)
    assert missing.epoch is None and missing.behind == ("b",)
    apart = pacing.choose(GRID, after=4000, sources={"a": mark("a", 5000), "b": mark("b", 6000)},
                          has_root_source=False, now=10**9)
    assert apart.epoch is None and not apart.behind and "no common epoch" in apart.reason


def test_newest_common_epoch():
    assert newest_common_epoch([mark("a", 1000, 2000, 3000), mark("b", 2000, 4000)]) == 2000
    assert newest_common_epoch([mark("a", 1000), mark("b", 2000)]) is None
    assert newest_common_epoch([mark("a", 1000), None]) is None
    assert newest_common_epoch([]) is None


def test_a_job_follows_the_slowest_cadence_upstream_of_it():
    def job(sources, sinks):
        return JobRecord(sources=tuple(sources), sinks=tuple(sinks))
    topo = Topology(1, 1, {"stream": job(["raw"], ["s"]), "hourly": job(["s"], ["h"]), "report": job(["h", "s"], ["r"]),
                           "side": job(["s"], ["x"])})
    cadences = effective_cadences(topo, {"hourly": Pacing(every_ms=3_600_000), "side": Pacing(every_ms=60_000)}, 5000)
    assert cadences == {"stream": (5000, None), "hourly": (3_600_000, None), "report": (3_600_000, "hourly"),
                        "side": (60_000, None)}
    # A chain far deeper than Python's recursion limit.
    n = 3000
    chain = Topology(1, 1, {f"j{i:05d}": job([f"t{i + 1}"] if i + 1 < n else [], [f"t{i}"]) for i in range(n)})
    deep = effective_cadences(chain, {f"j{n - 1:05d}": Pacing(every_ms=60_000)}, 1000)
    assert deep["j00000"] == (60_000, f"j{n - 1:05d}")


def test_a_job_far_behind_waits_only_for_an_upstream_epoch_in_flight_that_covers_far_more():
    pacing = Pacing(grace_ms=0)
    # Catching up: more than 3 cadences behind the clock (1 s grid), not when keeping up.
    assert pacing.catching_up(GRID, available=5000, now=9001) and not pacing.catching_up(GRID, 5000, now=8000)
    assert not Pacing(every_ms=4000).catching_up(GRID, available=5000, now=16_000)  # 2.5 of its 4 s cadences
    # A takeover leaves a job about a session timeout behind: not downtime, until 3 session timeouts.
    assert not pacing.catching_up(GRID, available=5000, now=14_000, session_timeout_ms=3000)
    assert pacing.catching_up(GRID, available=5000, now=14_001, session_timeout_ms=3000)

    def worth(p: Pacing = pacing, *, after=10_000, available=11_000, in_flight=None, restarted=False, led=500.0):
        return p.worth_waiting(GRID, after=after, available=available, in_flight=in_flight,
                               upstream_restarted=restarted, leading_for_s=led)
    # Back from downtime: the upstream's tidemark offers 1 s since the last epoch, its epoch in flight 300 s.
    assert worth(in_flight=310_000)
    # A slow upstream's next epoch covers about as much as its last: take what is there.
    assert not worth(available=13_000, in_flight=16_000, led=0)
    # An upstream that took over with this job begins its catch-up epoch shortly (perhaps after recovering the
    # small epoch it had in flight): wait, while this job has led for less than 30 s.
    assert worth(in_flight=None, restarted=True, led=5) and worth(in_flight=11_500, restarted=True, led=5)
    assert not worth(in_flight=None, restarted=True, led=31) and not worth(in_flight=None, restarted=False, led=5)
    # Off this job's cadence, the upstream's epoch would not be one it could take.
    slow = Pacing(every_ms=4000)
    assert not worth(slow, after=8000, available=12_000, in_flight=310_000)
    assert worth(slow, after=8000, available=12_000, in_flight=312_000)
