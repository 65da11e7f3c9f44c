"""A representative subset of the fault suite (``make test-faults`` runs all of it), and its building blocks.

Each scenario runs once with a few faults on real processes, ZooKeeper and PostgreSQL; the run must
show no duplicate, no loss, no inconsistent read and every fault recovered.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from coordinator import ConfigurationError
from coordinator.crashpoints import STEPS, parse
from coordinator.history.checker import exactly_once
from coordinator.iceberg.snapshots import EPOCH_KEY, TERM_KEY
from coordinator.records import TableTidemark
from tests.faults.harness import Environment, published_out_of_term_order
from tests.faults.scenarios import run_scenario
from tests.helpers.wait import wait_for

SUBSET = [("kill-9", 5), ("zombie", 2), ("zombie-mid-commit", 1), ("takeover-pause", 2), ("session-expiry", 2),
          ("zk-restart", 2), ("zk-ensemble", 2), ("catalog-restart", 2), ("serve-kill", 2), ("zk-wipe", 1),
          ("fence-unregister", 1),
          ("coalesced-kill", 2), ("mixed-cadence", 3), ("object-store-kill", 2), ("rest-commit-kill", 1),
          ("slow-object-store", 1), ("clock-skew", 3), ("zk-partition", 2), ("zk-split", 1), ("catalog-partition", 1)]


@pytest.fixture(scope="module")
def fault_env(tmp_path_factory):
    with Environment(tmp_path_factory.mktemp("faults")) as env:
        yield env


@pytest.mark.fault
@pytest.mark.parametrize("scenario,faults", SUBSET, ids=[s for s, _ in SUBSET])
def test_scenario_loses_duplicates_and_misreads_nothing(fault_env, scenario, faults, caplog):
    caplog.set_level(logging.INFO, logger="coordinator.zookeeper")  # the harness's own session: each reconnection
    result = run_scenario(fault_env, scenario, 0, 7, faults)

    def details() -> str:  # read only when an assertion fails: a passing run reads no log
        return "\n".join([*result.problems,
                          *(f"inconsistent at {i.epoch}: {i.problem}" for i in result.inconsistencies),
                          *(f"driver exit: {e}" for e in result.unexpected_exits), *map(str, result.faults),
                          *result.unreadable[-5:], _ends_of_logs(fault_env, fault_env.run_dir(scenario, 0))])
    assert not result.problems, details()
    assert len(result.faults) >= faults
    assert (result.duplicates, result.losses, len(result.inconsistencies)) == (0, 0, 0), details()
    assert result.checked >= 2 and result.produced > 0
    assert result.served_reads >= 2, details()  # pyiceberg's RestCatalog read through `tidemark serve`, each checked
    assert all(f.recovered_ms is not None for f in result.faults), details()


def _ends_of_logs(env: Environment, run_dir: Path, lines: int = 25) -> str:
    """The last lines of each process's log of a run (drivers, producer, a scenario's own servers) and of the shared
    servers' (ZooKeeper, the lakehouse): all that CI keeps of a failed run."""
    return "\n".join(f"--- {path.relative_to(env.base) if path.is_relative_to(env.base) else path}, "
                     f"last {lines} lines:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                     for path in [*sorted(run_dir.rglob("*.log")), *env.server_logs] if path.is_file())


def test_crash_points_are_parsed_strictly():
    assert parse("staged") == ("staged", 1) and parse("published-one:3") == ("published-one", 3)
    assert set(STEPS) >= {"begin", "staged", "precommitted", "published-one", "committed", "idle-commit"}
    for bad in ("stagged", "staged:0", "staged:x", "staged:-1", ""):
        with pytest.raises(ConfigurationError):
            parse(bad)


def test_a_sink_published_under_an_older_term_after_a_newer_one_is_reported(tmp_path):
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=pa.schema([("x", pa.int64())]))
    for term in (1, 2, 2):
        table.append(pa.table({"x": [term]}), snapshot_properties={TERM_KEY: str(term), EPOCH_KEY: str(term)})
    assert published_out_of_term_order(catalog, ["c.ns.t"]) == []
    table.append(pa.table({"x": [9]}), snapshot_properties={TERM_KEY: "1", EPOCH_KEY: "9"})
    (problem,) = published_out_of_term_order(catalog, ["c.ns.t"])
    assert "(epoch 9) published under term 1 after term 2 had published" in problem


def test_exactly_once_counts_duplicates_and_losses():
    assert exactly_once([1, 2, 3], [3, 2, 1]).holds
    tally = exactly_once([1, 2, 3, 3], [1, 1, 3, 4])
    assert (tally.duplicates, tally.losses) == (2, 2)   # an extra 1 and a 4; 2 and one 3 missing


@pytest.mark.fault
def test_tidemark_cache_follows_changes_made_after_a_zookeeper_restart(zk_server, tm, connect):
    """kazoo drops every watch when its connection drops: the cache must re-watch, not serve a stale value."""
    tm.register_job("w", sources=[], sinks=["db.t"])
    cache = connect(session_timeout=20).tidemark_cache()
    assert cache.get(["db.t"])["db.t"].epoch is None
    zk_server.kill()
    zk_server.start()
    wait_for(lambda: tm.connection_state == "CONNECTED", "the test's session to reconnect")
    tm.client.set(tm.paths.tidemark("db.t"), TableTidemark("db.t", 1000, None, 1, 1000).to_json())
    wait_for(lambda: (cache.get(["db.t"])["db.t"].epoch == 1000), "the cache to see the new tidemark", timeout=30)
