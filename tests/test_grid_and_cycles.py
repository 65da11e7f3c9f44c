"""Pure logic, checked exhaustively against brute force: the barrier grid's arithmetic and the cycle finder."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.protocol.barriers import BarrierGrid
from coordinator.protocol.topology import Topology
from coordinator.records import JobRecord

PURE = settings(max_examples=300, deadline=None, derandomize=True)

intervals = st.integers(min_value=1, max_value=50)
changes = st.lists(st.fixed_dictionaries({"from_epoch": st.integers(0, 400), "interval_ms": intervals}),
                   max_size=3, unique_by=lambda c: c["from_epoch"])


def _grid_points(grid: BarrierGrid, up_to: int) -> list[int]:
    return [t for t in range(0, up_to + 1) if grid.is_barrier(t)]


@PURE
@given(interval=intervals, changes=changes, t=st.integers(0, 500))
def test_floor_is_the_newest_grid_point_at_or_before_t(interval, changes, t):
    grid = BarrierGrid(interval, changes=tuple(changes))
    assert grid.floor(t) == max(_grid_points(grid, t))


@PURE
@given(interval=intervals, changes=changes, t=st.integers(0, 500))
def test_next_candidate_is_the_first_grid_point_after_t(interval, changes, t):
    grid = BarrierGrid(interval, changes=tuple(changes))
    candidate = grid.next_candidate(t)
    assert candidate > t and grid.is_barrier(candidate)
    assert not [p for p in _grid_points(grid, candidate - 1) if p > t]


@PURE
@given(interval=intervals, changes=changes, t=st.integers(0, 500))
def test_an_interval_change_starts_a_barrier_and_its_interval_holds_after_it(interval, changes, t):
    grid = BarrierGrid(interval, changes=tuple(changes))
    for change in changes:
        assert grid.is_barrier(change["from_epoch"])
    started = [c for c in changes if c["from_epoch"] <= t]
    expected = max(started, key=lambda c: c["from_epoch"])["interval_ms"] if started else interval
    assert grid.interval_at(t) == expected


jobs_graphs = st.lists(st.tuples(st.sets(st.integers(0, 5), max_size=3), st.integers(0, 5)), min_size=1, max_size=6)


def _topology(spec) -> Topology:
    """Job ``j<i>`` reads tables ``t<s>`` for s in its sources and writes ``t<sink>``; a table has one writer."""
    jobs, written = {}, set()
    for index, (sources, sink) in enumerate(spec):
        if sink in written:
            continue
        written.add(sink)
        jobs[f"j{index}"] = JobRecord(tuple(f"t{s}" for s in sorted(sources)), (f"t{sink}",))
    return Topology(0, 0, jobs)


@PURE
@given(spec=jobs_graphs)
def test_find_cycle_finds_one_exactly_when_a_job_depends_on_itself(spec):
    topo = _topology(spec)
    cyclic = any(job in _reachable_from_downstream(topo, job) for job in topo.jobs)
    found = topo.find_cycle()
    assert (found is not None) == cyclic
    if found is not None:
        names = [step.split(" ")[0] for step in found]
        assert names[0] == names[-1]
        for step, following in zip(found, names[1:]):
            job, table = step.split(" -[")[0], step.split(" -[")[1].rstrip("]->")
            assert table in topo.jobs[job].sinks and table in topo.jobs[following].sources


def _reachable_from_downstream(topo: Topology, job: str) -> set[str]:
    """Brute force: every job reachable downstream from ``job``'s direct readers (``job`` itself if cyclic)."""
    readers = {d for u, _, d in topo.edges() if u == job}
    seen = set(readers)
    frontier = list(readers)
    while frontier:
        current = frontier.pop()
        for u, _, d in topo.edges():
            if u == current and d not in seen:
                seen.add(d)
                frontier.append(d)
    return seen


def test_find_cycle_walks_a_chain_of_thousands_without_recursion():
    chain = {f"j{i}": JobRecord((f"t{i}",), (f"t{i + 1}",)) for i in range(5000)}
    assert Topology(0, 0, chain).find_cycle() is None
    chain["j5000"] = JobRecord(("t5000",), ("t0",))
    found = Topology(0, 0, chain).find_cycle()
    assert found is not None and len(found) == 5002


def test_upstream_first_orders_every_job_after_its_upstream_jobs_even_in_a_long_chain_or_a_cycle():
    chain = {f"j{i}": JobRecord((f"t{i}",), (f"t{i + 1}",)) for i in range(5000)}
    order = Topology(0, 0, chain).upstream_first()
    assert order == sorted(chain, key=lambda j: int(j[1:]))
    diamond = {"top": JobRecord((), ("a",)), "left": JobRecord(("a",), ("b",)), "right": JobRecord(("a",), ("c",)),
               "join": JobRecord(("b", "c"), ("d",))}
    order = Topology(0, 0, diamond).upstream_first()
    assert sorted(order) == sorted(diamond) and order[0] == "top" and order[-1] == "join"
    cycle = {"x": JobRecord(("ty",), ("tx",)), "y": JobRecord(("tx",), ("ty",)), "z": JobRecord(("tx",), ("tz",))}
    order = Topology(0, 0, cycle).upstream_first()
    assert sorted(order) == ["x", "y", "z"] and order.index("z") > order.index("x"), "each job once, cycle or not"
