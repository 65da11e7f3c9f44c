"""Registration and topology on a real ZooKeeper: one writer per table, no cycles, atomic and idempotent."""
from __future__ import annotations

import threading
from typing import Optional

import pytest

from coordinator import CorruptState, CycleError, InvalidName, JobRecord, RegistrationError, Topology, WriterConflict
from coordinator.errors import SinksNotFenced
from tests.helpers.lake import create_table


def test_register_is_idempotent_and_changes_are_explicit(tm):
    first = tm.register_job("counts", sources=["lake.db.words"], sinks=["lake.db.counts"])
    assert tm.register_job("counts", sources=["lake.db.words"], sinks=["lake.db.counts"]) == first
    version = tm.topology().version
    with pytest.raises(RegistrationError, match="replace=True"):
        tm.register_job("counts", sources=["lake.db.words"], sinks=["lake.db.other"])
    tm.register_job("counts", sources=["lake.db.words"], sinks=["lake.db.other"], replace=True)
    topo = tm.topology()
    assert topo.version == version + 1
    assert topo.writers == {"lake.db.other": "counts"}
    assert tm.tidemarks(["lake.db.counts"]) == {"lake.db.counts": None}


def test_concurrent_registrations_of_one_sink_have_exactly_one_winner(connect):
    clients = [connect() for _ in range(4)]
    for trial in range(15):
        sink = f"lake.db.sink{trial}"
        outcomes: dict[str, object] = {}
        start = threading.Barrier(len(clients))

        def register(i: int) -> None:
            start.wait()
            try:
                clients[i].register_job(f"job{trial}_{i}", sources=[], sinks=[sink])
                outcomes[f"job{trial}_{i}"] = "won"
            except WriterConflict as exc:
                outcomes[f"job{trial}_{i}"] = exc
        threads = [threading.Thread(target=register, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [job for job, outcome in outcomes.items() if outcome == "won"]
        assert len(winners) == 1, outcomes
        assert clients[0].topology().writer_of(sink) == winners[0]
        for job, outcome in outcomes.items():
            if job != winners[0]:
                assert isinstance(outcome, WriterConflict) and outcome.owner == winners[0]


@pytest.mark.parametrize("length", [1, 2, 5])
def test_registration_closing_a_cycle_is_refused_and_names_it(tm, length):
    tables = [f"lake.c.t{i}" for i in range(length)]
    for i in range(length - 1):  # job i reads t{i} and writes t{i+1}
        tm.register_job(f"j{i}", sources=[tables[i]], sinks=[tables[i + 1]])
    version = tm.topology().version
    with pytest.raises(CycleError) as err:
        tm.register_job(f"j{length - 1}", sources=[tables[-1]], sinks=[tables[0]])
    cycle_jobs = [step.split(" ")[0] for step in err.value.cycle]
    assert sorted(set(cycle_jobs)) == sorted(f"j{i}" for i in range(length))
    assert cycle_jobs[0] == cycle_jobs[-1]
    assert all(t in str(err.value) for t in tables)
    assert tm.topology().version == version, "a refused registration changes nothing"


@pytest.mark.parametrize("name", ["a/b", "..", "x..y", "", ".hidden", "tab\tle", "x" * 201, "caf\u00e9", "a b"])
def test_invalid_names_are_refused_before_any_path_is_built(tm, name):
    with pytest.raises(InvalidName):
        tm.register_job("ok", sources=[], sinks=[name])
    with pytest.raises(InvalidName):
        tm.register_job(name, sources=[], sinks=["lake.db.ok"])
    assert tm.topology().jobs == {}


def test_topology_queries_and_renderings(tm):
    tm.register_job("ingest", sources=["raw.words"], sinks=["lake.db.words"])
    tm.register_job("counts", sources=["lake.db.words"], sinks=["lake.db.counts"])
    tm.register_job("hist", sources=["lake.db.counts"], sinks=["lake.db.hist"])
    topo = tm.topology()
    assert topo.upstream("hist") == {"counts", "ingest"}
    assert topo.downstream("ingest") == {"counts", "hist"}
    assert topo.root_tables == {"raw.words"}
    assert ("ingest", "lake.db.words", "counts") in topo.edges()
    assert '"counts" -> "lake.db.counts";' in topo.to_dot()
    assert topo.to_mermaid().startswith("flowchart LR")


def test_unregister_needs_a_fenced_or_absent_leader(tm, connect, catalog_settings, namespace):
    create_table(catalog_settings.load(), f"{namespace}.counts")
    tm.register_job("counts", sources=[], sinks=[f"{namespace}.counts"])
    driver = connect()
    leadership = driver.leadership("counts")
    leadership.acquire()
    with pytest.raises(RegistrationError, match="live leader"):
        tm.unregister_job("counts")
    tm.fence_job("counts")
    tm.unregister_job("counts", confirm=True, catalog=catalog_settings)
    assert tm.topology().jobs == {}
    tm.register_job("other", sources=[], sinks=[f"{namespace}.counts"])  # the table is free again


def test_unregister_refuses_when_it_cannot_fence_the_sinks_in_iceberg(tm, catalog_settings, namespace):
    """Without the sinks' Iceberg metadata the fence cannot be written there, and the next registration
    could reuse this one's terms: nothing changes unless the operator says the sinks are gone for good."""
    tm.register_job("counts", sources=[], sinks=[f"{namespace}.never_created"])
    with pytest.raises(SinksNotFenced, match="--unfenced"):
        tm.unregister_job("counts", confirm=True, catalog=catalog_settings)
    assert "counts" in tm.topology().jobs and tm.status().jobs[0].name == "counts"
    plan = tm.unregister_job("counts", confirm=True, catalog=catalog_settings, allow_unfenced=True)
    assert plan.resume is None and plan.unreadable
    assert tm.topology().jobs == {}


def test_corrupt_znode_is_reported_with_its_path(tm, connect):
    tm.register_job("counts", sources=[], sinks=["lake.db.counts"])
    tm.client.set(tm.paths.job("counts"), b'{"sources": 5}')
    with pytest.raises(CorruptState, match="/jobs/counts"):
        connect().topology()  # a fresh session has no cached topology to fall back on


def test_digest_auth_makes_znodes_writable_only_by_their_owner(zk_connect, connect):
    owner = connect(auth=("etl", "secret"))
    owner.register_job("secured", sources=[], sinks=["lake.db.secured"])
    stranger = connect()
    assert stranger.topology().writer_of("lake.db.secured") == "secured"  # world-readable
    from kazoo.exceptions import NoAuthError
    with pytest.raises(NoAuthError):
        stranger.client.set(stranger.paths.job("secured"), b"{}")


# -- cycle finding on hand-made topologies (no ZooKeeper) ---------------------------------------

def topology(**jobs: tuple[list[str], list[str]]) -> Topology:
    """``topology(a=(sources, sinks), ...)``."""
    return Topology(version=1, znode_version=1,
                    jobs={name: JobRecord(sources=tuple(src), sinks=tuple(dst)) for name, (src, dst) in jobs.items()})


def assert_is_cycle(topo: Topology, cycle: Optional[list[str]]) -> list[str]:
    """``cycle`` is ``["a -[t]->", "b -[u]->", "a"]`` and every step is a real edge; returns its jobs."""
    assert cycle is not None, "no cycle found"
    assert cycle[0].split(" ")[0] == cycle[-1], cycle
    jobs = [step.split(" ")[0] for step in cycle]
    for step, downstream in zip(cycle, jobs[1:]):
        upstream, table = step.split(" ")[0], step.split("[")[1].split("]")[0]
        assert table in topo.jobs[upstream].sinks and table in topo.jobs[downstream].sources, (step, downstream)
    assert len(set(jobs[:-1])) == len(jobs) - 1, f"a cycle visits each job once: {cycle}"
    return jobs[:-1]


def test_find_cycle_finds_none_in_graphs_without_cycles():
    assert topology().find_cycle() is None
    assert topology(a=([], ["t.a"])).find_cycle() is None
    assert topology(a=(["raw"], ["t.a"]), b=(["t.a"], ["t.b"]), c=(["t.b"], ["t.c"])).find_cycle() is None
    # A diamond: d is reached twice, through b and through c; that is not a cycle.
    diamond = topology(a=([], ["t.a"]), b=(["t.a"], ["t.b"]), c=(["t.a"], ["t.c"]), d=(["t.b", "t.c"], ["t.d"]))
    assert diamond.find_cycle() is None
    # Two jobs reading the same table and a job reading a table nobody writes.
    assert topology(a=([], ["t.a"]), b=(["t.a", "raw"], []), c=(["t.a"], [])).find_cycle() is None


def test_find_cycle_names_each_cycle_with_its_tables():
    self_loop = topology(a=(["t.a"], ["t.a"]))
    assert self_loop.find_cycle() == ["a -[t.a]->", "a"]
    pair = topology(a=(["t.b"], ["t.a"]), b=(["t.a"], ["t.b"]))
    assert sorted(assert_is_cycle(pair, pair.find_cycle())) == ["a", "b"]
    # Reached through a tail: the cycle is c -> d -> e -> c, not the jobs leading to it.
    tail = topology(a=([], ["t.a"]), b=(["t.a"], ["t.b"]), c=(["t.b", "t.e"], ["t.c"]), d=(["t.c"], ["t.d"]),
                    e=(["t.d"], ["t.e", "t.out"]), f=(["t.out"], []))
    assert sorted(assert_is_cycle(tail, tail.find_cycle())) == ["c", "d", "e"]
    # A cycle in a component that sorts after an acyclic one, behind a diamond.
    apart = topology(a=([], ["t.a"]), b=(["t.a"], ["t.b"]), c=(["t.a"], ["t.c"]), d=(["t.b", "t.c"], []),
                     x=(["t.z"], ["t.x"]), y=(["t.x"], ["t.y"]), z=(["t.y"], ["t.z"]))
    assert sorted(assert_is_cycle(apart, apart.find_cycle())) == ["x", "y", "z"]
    # Two tables between the same pair of jobs: any one of them closes the cycle.
    double = topology(a=(["t.b2"], ["t.a"]), b=(["t.a"], ["t.b1", "t.b2"]))
    assert sorted(assert_is_cycle(double, double.find_cycle())) == ["a", "b"]


def test_find_cycle_handles_chains_longer_than_the_recursion_limit():
    length = 5000
    jobs = {f"j{i:05d}": ([f"t.{i - 1}"] if i else [], [f"t.{i}"]) for i in range(length)}
    assert topology(**jobs).find_cycle() is None
    jobs["j00000"] = ([f"t.{length - 1}"], ["t.0"])
    closed = topology(**jobs)
    assert len(assert_is_cycle(closed, closed.find_cycle())) == length
