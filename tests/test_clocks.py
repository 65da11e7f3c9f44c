"""A driver whose wall clock is wrong (``tests/helpers/skewclock.c`` preloaded into a real driver process: its
Python and every library see the wrong time, its monotonic clock stays right) paces its epochs on ZooKeeper's
clock (``coordinator/zookeeper/clock.py``, ``docs/design.md`` "Clocks"):

- 30 s ahead, it takes no barrier before ZooKeeper's clock passed it by the grace (on its own clock it would take
  barriers 30 s early, which a root table's producers reach 30 s later);
- 30 s behind, it keeps up (on its own clock it would lag 30 s);
- stepped back 10 s mid-run (an NTP correction), it neither stalls nor repeats an epoch;
- a derived job's driver 30 s ahead takes only the barriers its source committed, none before it did;

and in each case it reports its skew and a true lag, and stamps its tables' commit times on ZooKeeper's clock.
The epoch's commit time is the ``mtime`` ZooKeeper stamped on its epoch record, on the server's (this host's
true) clock."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.operations.zookeeper_server import free_port
from coordinator.records import EpochRecord, EpochState
from tests.helpers.lake import create_table
from tests.helpers.python_driver import EPOCH_SCHEMA
from tests.helpers.skewclock import SkewedClock
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.fault
REPO = Path(__file__).resolve().parent.parent
INTERVAL_MS, GRACE_MS = 1000, 200  # the serve driver's grid and grace (tests/helpers/python_driver.py)
SLACK_MS = 3000  # a loaded machine's delay between a barrier the clock passed and its commit


class SkewedDriver:
    """A driver of ``tests/helpers/python_driver.py`` under a wrong clock, with its metrics: by default the serve
    driver (job ``served``: one row per epoch, no source)."""

    def __init__(self, tmp_path: Path, zk_connect: str, catalog_settings, sink: str, offset_ms: int,
                 mode: str = "serve", job: str = "served", **options: str) -> None:
        (tmp_path / job).mkdir(exist_ok=True)
        self.clock = SkewedClock(tmp_path / job, offset_ms)
        self.port = free_port()
        config = {"mode": mode, "connect": zk_connect, "session_timeout": 10.0, "job": job,
                  "catalog": {"name": catalog_settings.name, "uri": catalog_settings.uri,
                              "warehouse": catalog_settings.warehouse},
                  "log": sink, **options}
        self.log = open(tmp_path / f"{job}.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.python_driver", json.dumps(config)], cwd=REPO,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, **self.clock.env(), "TIDEMARK_METRICS_PORT": str(self.port)})

    def metric(self, name: str) -> float | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as reply:
                body = reply.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == name:
                    return sample.value
        return None

    def stop(self) -> str:
        self.proc.kill()
        self.proc.wait(30)
        self.log.close()
        return (Path(self.log.name)).read_text()[-3000:]


def commits(tm, job: str = "served") -> dict[int, int]:
    """Each committed epoch of ``job`` -> when ZooKeeper committed it (its record's mtime, the server's clock)."""
    done = {}
    path = tm.paths.epochs(job)
    for name in tm.children(path):
        found = tm.client.get(f"{path}/{name}")
        record = EpochRecord.from_json(found[0], f"{path}/{name}")
        if record.state == EpochState.COMMITTED:
            done[record.epoch] = found[1].mtime
    return done


def at_least(done: dict[int, int], count: int, after_ms: int = 0) -> dict[int, int] | None:
    """``done`` once it has ``count`` epochs committed after ``after_ms``; else None."""
    return done if sum(m > after_ms for m in done.values()) >= count else None


@pytest.fixture
def served(tmp_path, zk_connect, catalog_settings, namespace):
    sink = f"{namespace}.log"
    create_table(catalog_settings.load(), sink, EPOCH_SCHEMA, first_snapshot=False)
    started: list[SkewedDriver] = []

    def start(offset_ms: int) -> SkewedDriver:
        started.append(SkewedDriver(tmp_path, zk_connect, catalog_settings, sink, offset_ms))
        return started[-1]
    yield start
    for driver in started:
        driver.stop()


@pytest.mark.parametrize("offset_s", [30, -30])
def test_a_driver_whose_clock_is_off_by_30_s_takes_barriers_on_zookeepers_clock_and_says_by_how_much(
        tm, served, namespace, offset_s):
    driver = served(offset_s * 1000)
    done = wait_for(lambda: at_least(commits(tm), 6), "six epochs of the skewed driver", timeout=120)
    early = {t: m for t, m in done.items() if m < t + GRACE_MS - 50}  # 50 ms: ZooKeeper's stamp is ms-rounded
    late = {t: m for t, m in done.items() if m - t > INTERVAL_MS + GRACE_MS + SLACK_MS}
    assert not early, f"epochs committed before ZooKeeper's clock passed them by the grace (epoch: commit): {early}"
    newest = max(done)
    assert not {t: m for t, m in late.items() if t != min(done)}, f"epochs committed late: {late}"
    skew = wait_for(lambda: driver.metric("tidemark_driver_clock_skew_seconds"), "the skew metric", timeout=30)
    assert abs(skew - offset_s) < 1.0, skew
    lag = wait_for(lambda: driver.metric("tidemark_driver_lag_seconds"), "the lag metric", timeout=30)
    assert 0 <= lag < (INTERVAL_MS + GRACE_MS + SLACK_MS) / 1000, f"lag {lag} s at epoch {newest}"
    # The table's commit time, which every freshness figure reads, is ZooKeeper's too (it was this host's).
    mark = tm.tidemarks([f"{namespace}.log"])[f"{namespace}.log"]
    stamped = commits(tm)[mark.epoch]
    assert abs(mark.committed_ms - stamped) < 1000, (mark.committed_ms, stamped)


def test_a_driver_whose_clock_steps_back_10_s_mid_run_neither_stalls_nor_repeats_an_epoch(
        tm, served, catalog_settings, namespace):
    driver, sink = served(0), f"{namespace}.log"
    before = wait_for(lambda: at_least(commits(tm), 3), "three epochs before the step", timeout=120)
    driver.clock.set(-10_000)
    stepped = max(before.values())
    after = wait_for(lambda: at_least(commits(tm), 6, after_ms=stepped), "six epochs after the step", timeout=60)
    epochs = sorted(after)
    written = Counter(catalog_settings.load().load_table(sink).scan().to_arrow().column("epoch").to_pylist())
    assert set(written) >= set(epochs) and max(written.values()) == 1, f"an epoch written twice: {written}"
    times = [after[t] for t in epochs]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= INTERVAL_MS + SLACK_MS, f"a stall after the step: commit gaps {gaps} ms"
    assert all(m >= t + GRACE_MS - 50 for t, m in after.items())
    skew = wait_for(lambda: (s := driver.metric("tidemark_driver_clock_skew_seconds")) is not None and s < -9 and s,
                    "the skew metric to show the step", timeout=30)
    assert abs(skew + 10) < 1.0, skew


def test_a_derived_job_whose_clock_is_30_s_ahead_takes_only_barriers_its_source_committed(
        tm, served, tmp_path, zk_connect, catalog_settings, namespace):
    """A derived job's barriers are its sources' committed epochs, whatever its clock says; its lag is measured on
    ZooKeeper's clock, so it reads true too."""
    served(0)
    wait_for(lambda: at_least(commits(tm), 1), "the source job's first epoch", timeout=120)
    copies = f"{namespace}.copies"
    create_table(catalog_settings.load(), copies, EPOCH_SCHEMA, first_snapshot=False)
    derived = SkewedDriver(tmp_path, zk_connect, catalog_settings, copies, 30_000, mode="copy", job="copier",
                           source=f"{namespace}.log")
    try:
        done = wait_for(lambda: at_least(commits(tm, "copier"), 6), "six epochs of the skewed derived job",
                        timeout=120)
        upstream = commits(tm)
        assert set(done) <= set(upstream), f"barriers its source never committed: {sorted(set(done) - set(upstream))}"
        early = {t: (upstream[t], m) for t, m in done.items() if m < upstream[t]}
        assert not early, f"epochs committed before their source committed them (epoch: source, own): {early}"
        newest = max(done)
        copied = Counter(catalog_settings.load().load_table(copies).scan().to_arrow().column("epoch").to_pylist())
        assert max(copied.values()) == 1 and set(copied) == {t for t in upstream if t <= newest}, copied
        skew = wait_for(lambda: derived.metric("tidemark_driver_clock_skew_seconds"), "the skew metric", timeout=30)
        assert abs(skew - 30) < 1.0, skew
        lag = wait_for(lambda: derived.metric("tidemark_driver_lag_seconds"), "the lag metric", timeout=30)
        assert 0 <= lag < (2 * INTERVAL_MS + GRACE_MS + SLACK_MS) / 1000, f"lag {lag} s at epoch {newest}"
    finally:
        derived.stop()
