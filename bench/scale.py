"""Scale (issue 18): many pipelines on one ZooKeeper with pure-Python driver processes, each figure beside
its goal and a baseline measured in the same run.

    python -m bench scale [--smoke] [--only NAME ...] [options]     # --help lists the options

Every pipeline is a chain of real ``EpochWriter`` driver processes (``python -m bench.scale
--driver``) on one real ZooKeeper that the bench starts (``EmbeddedZooKeeper``), each pipeline
with its own embedded SQLite catalog. A *root* job (no source) appends ``--rows`` generated
events per epoch; a *derived* job appends one summary row per epoch (rows, total, and how many
root epochs the changes it read cover). A pipeline's consistent epoch is
``held_epochs.newest_common_epoch`` of its tables' tidemarks, and its lag is the wall clock minus it,
sampled every 0.5 s from a watch on the tidemarks.

Sub-benchmarks (``--only``, repeatable; all by default):

- ``isolation``: ``--pipelines`` root -> derived pipelines (one process per job) run twice: a
  baseline with no slow job, then with pipeline 0's derived job sleeping 3 intervals per epoch.
  Goal: every other pipeline's lag p95 within 1.2x of its baseline p95.
- ``cost``: ZooKeeper requests per job per epoch, counted by the server (``mntr``
  ``zk_packets_received``; the bench's own session is closed during the window, and its ``mntr``
  reads are subtracted), at ``--jobs`` real jobs (root -> derived chains, ``--writers-per-process``
  writers in each driver process, each writer with its own session) and ``--simulated`` jobs at the
  protocol layer (``--sim-driver`` processes, a session per job by default: the writer's own wait for
  the next epoch, ``NextEpoch``, with its watches on the grid, the topology and the tidemarks, and
  ``EpochCoordinator`` begin / precommit / commit, with no Iceberg). Pings of the jobs' sessions count:
  they are requests too. Goal: at most 10, flat within 1.5x from the smallest to the largest.
- ``catchup``: a derived job stopped for ``--pause`` seconds while its root job runs. Goal: one call
  of its function covers the backlog; also the time until it is within one interval of the clock.
- ``mixed``: a streaming root -> derived cascade on the grid, and a batch job reading the derived table
  at ``--every`` ms (``EpochWriter(every=...)``). Prints the batch job's epochs per cadence period and
  checks consistent reads over all three tables at random times (``ConsistencyChecker`` with an
  invariant on row counts and totals). Goals: one batch epoch per period, every read consistent.
- ``overload``: a derived job taking 1.5 intervals per epoch, beside a normal pipeline (the baseline).
  Goal: lag p95 <= 2 x its epoch time + interval, and flat (second half's p95 within 1.1x of the first).
- ``idle``: catalog commits per idle epoch, counted by a trigger on the SQLite catalog's
  ``iceberg_tables.metadata_location`` and classified from the metadata files (new snapshot, committed-
  epoch marker, other), for a root job over an unchanging root table -> derived job; baseline in the same
  run: the same pipeline with ``marker_every`` = the interval (a marker each idle epoch). Goal: 0 commits
  per idle epoch apart from the marker round at the first epoch of each minute.

Spark is not used here. The Spark catch-up is ``python -m bench pipeline --engine spark --scenario catchup``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .common import (
    header,
    log_each_epoch,
    packets_received,
    percentile,
    remove_run_dir,
    run_until_stopped,
    stop_drivers,
    verdict,
    zookeeper,
)

REPO = Path(__file__).resolve().parent.parent
SAMPLE_EVERY_S = 0.5
CATALOG = "lake"
SUBS = ("isolation", "cost", "catchup", "mixed", "overload", "idle")

# Full-run parameters (about 25 minutes for all six) and the smoke run's (--smoke: seconds each).
FULL: dict[str, Any] = dict(interval_ms=5000, grace_ms=1000, rows=50, pipelines=6, iso_minutes=1.5,
                            jobs=[4, 16, 64], simulated=[1000], cost_seconds=30.0, writers_per_process=16,
                            sim_processes=4, jobs_per_session=1, pause=300.0, warmup=30.0, every_ms=60_000,
                            mixed_minutes=3.0, overload_minutes=2.0, idle_minutes=1.5)
SMOKE: dict[str, Any] = dict(interval_ms=1000, grace_ms=200, rows=10, pipelines=3, iso_minutes=0.25,
                             jobs=[4, 8], simulated=[8, 40], cost_seconds=8.0, writers_per_process=4,
                             sim_processes=2, jobs_per_session=1, pause=10.0, warmup=4.0, every_ms=4000,
                             mixed_minutes=0.4, overload_minutes=0.4, idle_minutes=0.25)


def _schemas():
    import pyarrow as pa
    events = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.int64()), pa.field("epoch", pa.int64())])
    summary = pa.schema([pa.field("epoch", pa.int64()), pa.field("rows", pa.int64()), pa.field("total", pa.int64()),
                         pa.field("covers", pa.int64())])
    return events, summary


# -- the driver processes ------------------------------------------------------------------------------

def _function(spec: Mapping[str, Any]) -> Callable[[Any], None]:
    """The epoch function of one job: ``generate`` (root, no source), ``copy`` (root over a root table),
    ``summarize`` (one row per epoch over an events table) or ``rollup`` (one row over a summary table)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    events_schema, summary_schema = _schemas()
    kind, sink, sleep_s = spec["kind"], spec["sink"], float(spec.get("sleep_s") or 0.0)
    source = spec["sources"][0] if spec["sources"] else None

    def total(table: pa.Table, column: str) -> int:
        return int(pc.sum(table[column]).as_py() or 0) if table.num_rows else 0

    def step(ctx) -> None:
        if kind == "generate":
            rows = int(spec["rows"])
            base = ctx.epoch * 1000
            ctx.append(sink, pa.table({"id": list(range(base, base + rows)), "value": [i % 97 for i in range(rows)],
                                       "epoch": [ctx.epoch] * rows}, schema=events_schema))
        elif kind == "copy":
            ctx.append(sink, ctx.changes(source).select(["id", "value", "epoch"]).cast(events_schema))
        elif kind == "summarize":
            new = ctx.changes(source)
            covers = len(pc.unique(new["epoch"])) if new.num_rows else 0
            ctx.append(sink, pa.table({"epoch": [ctx.epoch], "rows": [new.num_rows], "total": [total(new, "value")],
                                       "covers": [covers]}, schema=summary_schema))
        elif kind == "rollup":
            new = ctx.changes(source)
            ctx.append(sink, pa.table({"epoch": [ctx.epoch], "rows": [total(new, "rows")],
                                       "total": [total(new, "total")], "covers": [new.num_rows]},
                                      schema=summary_schema))
        else:
            raise ValueError(f"unknown job kind {kind!r}")
        if sleep_s:
            time.sleep(sleep_s)  # a job slower than its cadence
    return step


def _drive_one(config: Mapping[str, Any], spec: Mapping[str, Any], stop: threading.Event,
               writers: list, failures: list) -> None:
    from coordinator import CatalogSettings, EpochWriter, Tidemark
    from coordinator.job.commit import DEFAULT_MARKER_EVERY
    tm = None
    try:
        tm = Tidemark.connect(config["zk"], operation_timeout=60)
        writer = EpochWriter(tm, spec["job"], sources=spec["sources"], sinks=[spec["sink"]],
                             catalog=CatalogSettings.embedded(Path(spec["home"]), name=CATALOG),
                             interval_ms=config["interval_ms"], grace_ms=config["grace_ms"],
                             every=spec.get("every_ms"), log_every=30.0,
                             marker_every=spec.get("marker_every_ms") or DEFAULT_MARKER_EVERY)
        writers.append(writer)
        if stop.is_set():
            return
        function = _function(spec)
        ran: set[int] = set()

        def step(ctx) -> None:
            ran.add(ctx.epoch)
            function(ctx)
        with open(spec["events"], "a", buffering=1) as events:
            log_each_epoch(writer, ran, events)
            writer.run(step, stop_on_sigterm=False)
    except Exception as exc:  # reported by the process's exit code and log
        logging.getLogger("bench.scale").exception("job %s failed", spec["job"])
        failures.append(f"{spec['job']}: {type(exc).__name__}: {exc}")
        stop.set()
    finally:
        if tm is not None:
            tm.close()


def run_driver(config: Mapping[str, Any]) -> int:
    """Run every writer of ``config["writers"]`` in a thread (each with its own session) until SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    writers: list = []
    failures: list[str] = []
    threads = [threading.Thread(target=_drive_one, args=(config, spec, stop, writers, failures), daemon=True,
                                name=spec["job"]) for spec in config["writers"]]
    for thread in threads:
        thread.start()
    while not stop.wait(0.5):
        if not any(t.is_alive() for t in threads):
            break
    deadline = time.monotonic() + 120
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        for writer in list(writers):
            writer.stop()  # each finishes its epoch in flight (again: run() clears a stop made before it began)
        time.sleep(0.2)
    if failures:
        print("\n".join(failures), file=sys.stderr, flush=True)
    return 1 if failures else 0


def _simulate_job(tm, spec: Mapping[str, Any], config: Mapping[str, Any], stop: threading.Event,
                  commits: dict[str, list[int]], failures: list) -> None:
    """One job at the protocol layer, as ``EpochWriter`` runs it while leading, with made-up snapshot ids instead
    of Iceberg: the writer's own wait for the next epoch (``NextEpoch``: the grid and the topology watched, the
    sources' tidemarks cached, pacing and catch-up), the sources' and sink's tidemarks loaded a second time as
    ``DriverMetrics`` keeps them, and the epoch's transitions: begin, precommit, commit."""
    from coordinator.protocol.epochs import EpochCoordinator
    from coordinator.protocol.leadership import Leadership
    from coordinator.protocol.next_epoch import NextEpoch
    from coordinator.protocol.pacing import Pacing
    from coordinator.protocol.tidemarks import TidemarkCache
    from coordinator.records import EpochInputs, SourceRange, now_ms
    job, sink, sources = spec["job"], spec["sink"], list(spec["sources"])
    done = commits.setdefault(job, [])
    try:
        leadership = Leadership(tm, job)
        leadership.acquire(timeout=300)
        next_epoch = NextEpoch(tm, job, sources, Pacing(None, config["grace_ms"]))
        epochs = EpochCoordinator(leadership, [sink], history=100, grid=next_epoch.grid)
        epochs.recover()
        metrics = TidemarkCache(tm)  # DriverMetrics keeps the sources' and sinks' tidemarks loaded the same way
        opened = tm.server_clock.now_ms()
        previous: dict[str, Optional[int]] = {}
        while not stop.is_set():
            after = epochs.last_committed if epochs.last_committed is not None else opened
            target = next_epoch.wait(after, stopped=stop.is_set)
            if target is None:
                break
            marks = next_epoch.cache.get(next_epoch.managed)
            metrics.get(sorted({*next_epoch.managed, sink}))
            ends = {s: (m.snapshot_at(target) if (m := marks.get(s)) is not None else None) for s in sources}
            inputs = EpochInputs({s: SourceRange(previous.get(s), ends[s]) for s in sources})
            if config["computed"]:
                epochs.begin(target, inputs)
                epochs.precommit(target, {sink: target})
                epochs.commit(target, {sink: target})
            else:
                epochs.commit_idle(target, inputs)
            previous = ends
            done.append(now_ms())
        next_epoch.close()
        metrics.close()
        leadership.release()
    except Exception as exc:  # reported by the process's exit code
        logging.getLogger("bench.scale").exception("simulated job %s failed", job)
        failures.append(f"{job}: {type(exc).__name__}: {exc}")


def run_sim_driver(config: Mapping[str, Any]) -> int:
    """Simulated jobs, one thread each, ``jobs_per_session`` of them sharing a session; on SIGTERM, write each
    job's commit times (ms) to ``config["out"]``."""
    from coordinator import Tidemark
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    specs = config["jobs"]
    per = max(1, int(config["jobs_per_session"]))
    sessions = [Tidemark.connect(config["zk"], operation_timeout=120) for _ in range(0, len(specs), per)]
    commits: dict[str, list[int]] = {}
    failures: list[str] = []
    threads = [threading.Thread(target=_simulate_job, args=(sessions[i // per], spec, config, stop, commits, failures),
                                daemon=True) for i, spec in enumerate(specs)]
    run_until_stopped(threads, stop, 60)
    with open(config["out"], "w") as out:
        json.dump(commits, out)
    for tm in sessions:
        tm.close()
    if failures:
        print("\n".join(failures[:20]), file=sys.stderr, flush=True)
    return 1 if failures else 0


# -- the bench side --------------------------------------------------------------------------------------

@dataclass
class Job:
    name: str
    kind: str                    # generate | copy | summarize | rollup
    sources: tuple[str, ...]
    sink: str
    sleep_s: float = 0.0
    every_ms: Optional[int] = None
    marker_every_ms: Optional[int] = None


@dataclass
class Chain:
    """One pipeline: its jobs (upstream first) in a catalog of its own under ``home``."""

    name: str
    jobs: list[Job]
    root_tables: tuple[str, ...] = ()   # written outside Tidemark (once, at set-up)
    home: Path = field(default_factory=Path)

    @property
    def tables(self) -> list[str]:
        """The managed tables: every job's sink."""
        return [job.sink for job in self.jobs]

    def job(self, kind: str) -> Job:
        return next(j for j in self.jobs if j.kind == kind)


def table_name(chain: str, table: str) -> str:
    return f"{CATALOG}.{chain}.{table}"


def streaming_chain(name: str, slow_s: float = 0.0, batch_every_ms: Optional[int] = None) -> Chain:
    """root (generate) -> derived (summarize), and with ``batch_every_ms`` a batch job (rollup) after them."""
    events, summary = table_name(name, "events"), table_name(name, "summary")
    jobs = [Job(f"{name}-root", "generate", (), events), Job(f"{name}-derived", "summarize", (events,), summary,
                                                               sleep_s=slow_s)]
    if batch_every_ms is not None:
        jobs.append(Job(f"{name}-batch", "rollup", (summary,), table_name(name, "rollup"), every_ms=batch_every_ms))
    return Chain(name, jobs)


def idle_chain(name: str, marker_every_ms: Optional[int] = None) -> Chain:
    """An unchanging root table -> root job (copy) -> derived job (summarize): every epoch after the first is idle."""
    source, events, summary = (table_name(name, t) for t in ("source", "events", "summary"))
    return Chain(name, [Job(f"{name}-root", "copy", (source,), events, marker_every_ms=marker_every_ms),
                        Job(f"{name}-derived", "summarize", (events,), summary, marker_every_ms=marker_every_ms)],
                 root_tables=(source,))


class Deployment:
    """One run: a ZooKeeper chroot, pipelines each with their own SQLite catalog, the driver processes, and a
    watch on every pipeline's tidemarks."""

    def __init__(self, server, name: str, chains: Sequence[Chain], opts: argparse.Namespace) -> None:
        from coordinator import CatalogSettings, Tidemark
        self.server, self.name, self.chains, self.opts = server, name, list(chains), opts
        self.home = Path(tempfile.mkdtemp(prefix=f"tidemark-bench-scale-{name}-"))
        self.zk = f"{server.connect_string}/scale-{name}"
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        events_schema, summary_schema = _schemas()
        for chain in self.chains:
            chain.home = self.home / chain.name
            settings = CatalogSettings.embedded(chain.home, name=CATALOG)
            catalog = settings.load()
            catalog.create_namespace(chain.name)
            for table in [*chain.root_tables, *chain.tables]:
                schema = summary_schema if table.endswith(("summary", "rollup")) else events_schema
                catalog.create_table(settings.identifier(table), schema=schema)
        self.tm = Tidemark.connect(self.zk, operation_timeout=120)
        self.tm.barriers.ensure_grid(opts.interval_ms)
        for chain in self.chains:  # before any driver opens: each then knows which of its sources are managed
            for job in chain.jobs:
                self.tm.register_job(job.name, sources=job.sources, sinks=[job.sink])
        self.cache = self.tm.tidemark_cache()

    # -- processes

    def events_path(self, job: Job) -> Path:
        return self.home / f"epochs-{job.name}.jsonl"

    def start(self, group: Sequence[Job], label: Optional[str] = None) -> str:
        """One driver process running the jobs of ``group`` (one thread and session each); returns its label."""
        label = label or group[0].name
        chain_of = {j.name: c for c in self.chains for j in c.jobs}
        config = {"zk": self.zk, "interval_ms": self.opts.interval_ms, "grace_ms": self.opts.grace_ms,
                  "writers": [{"job": j.name, "kind": j.kind, "sources": list(j.sources), "sink": j.sink,
                               "home": str(chain_of[j.name].home), "rows": self.opts.rows, "sleep_s": j.sleep_s,
                               "every_ms": j.every_ms, "marker_every_ms": j.marker_every_ms,
                               "events": str(self.events_path(j))} for j in group]}
        self.processes[label] = self._spawn(["--driver", json.dumps(config)], label)
        return label

    def _spawn(self, argv: list[str], label: str) -> subprocess.Popen:
        with open(self.home / f"{label}.log", "a") as log:  # the child keeps its own descriptor
            return subprocess.Popen([sys.executable, "-m", "bench.scale", *argv], cwd=REPO, env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)

    def start_each(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self.start([job])

    def stop(self, labels: Optional[Iterable[str]] = None, timeout: float = 120) -> float:
        """SIGTERM the processes (each finishes its epoch in flight) and wait; returns the wall time they ended."""
        chosen = list(self.processes) if labels is None else list(labels)
        stop_drivers({label: self.processes.pop(label) for label in chosen}, timeout, self.tail)
        return time.time()

    def tail(self, label: str, lines: int = 20) -> str:
        path = self.home / f"{label}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join("    " + line for line in text[-lines:])

    def check_alive(self) -> None:
        for label, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"driver {label} exited with {proc.returncode}:\n{self.tail(label)}")

    # -- what the tidemarks say

    def consistent(self, chain: Chain, tables: Optional[Sequence[str]] = None) -> Optional[int]:
        """The newest epoch every one of the chain's tables (or ``tables``) holds, from the watched tidemarks."""
        from coordinator.protocol.held_epochs import newest_common_epoch
        return newest_common_epoch(self.cache.get(tables or chain.tables).values())

    def lag_s(self, chain: Chain, tables: Optional[Sequence[str]] = None) -> Optional[float]:
        epoch = self.consistent(chain, tables)
        return None if epoch is None else time.time() - epoch / 1000

    def wait_consistent(self, chains: Optional[Sequence[Chain]] = None, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for chain in chains or self.chains:
            while self.consistent(chain) is None:
                self.check_alive()
                if time.monotonic() > deadline:
                    epochs = {t: m.epoch if m else None for t, m in self.cache.get(chain.tables).items()}
                    raise RuntimeError(f"{chain.name}: no consistent epoch after {timeout:.0f} s ({epochs})")
                time.sleep(0.2)

    def sample(self, seconds: float, chains: Optional[Sequence[Chain]] = None,
               every: float = SAMPLE_EVERY_S) -> dict[str, list[tuple[float, float]]]:
        """Per chain, ``(wall s, lag s)`` about every ``every`` seconds (jittered) for ``seconds``."""
        chains = chains or self.chains
        samples: dict[str, list[tuple[float, float]]] = {c.name: [] for c in chains}
        jitter = random.Random(7)  # sampling at a fixed period would lock onto the grid's phase
        due = time.monotonic()
        end = due + seconds
        while time.monotonic() < end:
            self.check_alive()
            for chain in chains:
                lag = self.lag_s(chain)
                if lag is not None:
                    samples[chain.name].append((time.time(), lag))
            due += every * jitter.uniform(0.5, 1.5)
            time.sleep(max(0.0, due - time.monotonic()))
        return samples

    def events(self, job: Job) -> list[dict]:
        path = self.events_path(job)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # -- consistent reads

    def check(self, chain: Chain, tables: Optional[Sequence[str]] = None) -> tuple[Optional[int], Optional[str]]:
        """Read ``tables`` (default: the chain's) at their newest common epoch, each at the snapshot its tidemark
        names there, and check that they agree: the events' rows and value total equal the sum over the summary
        rows (and the rollup's). Returns the epoch and the problem (None: consistent)."""
        from coordinator import CatalogSettings, ConsistencyLevel, ConsistentVersion, Resolver
        from coordinator.history.checker import ConsistencyChecker
        from coordinator.protocol.held_epochs import newest_common_epoch
        names = list(tables or chain.tables)
        marks = self.cache.get(names)
        epoch = newest_common_epoch(marks.values())
        if epoch is None:
            return None, None
        version = ConsistentVersion(epoch, {t: marks[t].snapshot_at(epoch) for t in names},  # type: ignore[union-attr]
                                    ConsistencyLevel.AS_OF)
        settings = CatalogSettings.embedded(chain.home, name=CATALOG)
        checker = ConsistencyChecker(Resolver(settings.load(), settings, self.tm), names,
                                     lambda frames: _agree(frames, epoch))
        _, problem = checker.check(version)
        return epoch, problem

    def close(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.processes = {}
        self.cache.close()
        self.tm.close()
        remove_run_dir(self.home)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _agree(frames: Mapping[str, Any], epoch: int) -> Optional[str]:
    """The invariant of a chain read at one epoch: every table accounts for the same events."""
    import pyarrow.compute as pc

    def total(table, column: str) -> int:
        return int(pc.sum(table[column]).as_py() or 0) if table.num_rows else 0
    figures = {}
    for name, frame in frames.items():
        if "id" in frame.column_names:
            figures[name] = (frame.num_rows, total(frame, "value"))
        else:
            figures[name] = (total(frame, "rows"), total(frame, "total"))
        if frame.num_rows and pc.max(frame["epoch"]).as_py() > epoch:
            return f"{name} holds rows of epoch {pc.max(frame['epoch']).as_py()} at epoch {epoch}"
    if len(set(figures.values())) > 1:
        return "the tables disagree (rows, total): " + ", ".join(f"{n} {f}" for n, f in sorted(figures.items()))
    return None


def _p(values: Sequence[float], q: float) -> float:
    return percentile(list(values), q)


def _settle(opts: argparse.Namespace) -> float:
    """Seconds to let drivers drain their start-up before sampling."""
    return max(5.0, 3 * opts.interval_ms / 1000)


# -- isolation -------------------------------------------------------------------------------------------

def isolation(opts: argparse.Namespace, server) -> bool:
    interval_s = opts.interval_ms / 1000
    slow_s = 3 * interval_s
    header(f"isolation: {opts.pipelines} root -> derived pipelines, one driver process per job, "
           f"{opts.interval_ms} ms grid, {opts.iso_minutes:g} min per run; pipeline 0's derived job sleeps "
           f"{slow_s:g} s per epoch in the second run")
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {}
    epochs: dict[str, dict[str, int]] = {}
    checks: list[str] = []
    for label, slow in (("baseline", False), ("slow", True)):
        chains = [streaming_chain(f"i{k}", slow_s if slow and k == 0 else 0.0) for k in range(opts.pipelines)]
        with Deployment(server, f"iso-{label}", chains, opts) as run:
            run.start_each(j for c in chains for j in c.jobs)
            run.wait_consistent(timeout=600)
            time.sleep(_settle(opts))
            runs[label] = run.sample(opts.iso_minutes * 60)
            run.stop()
            epochs[label] = {c.name: sum(e["ran"] for e in run.events(c.job("summarize"))) for c in chains}
            for chain in chains:
                epoch, problem = run.check(chain)
                if problem is not None or epoch is None:
                    checks.append(f"{label} {chain.name} at {epoch}: {problem or 'no consistent epoch'}")
    print(f"lag = now - the pipeline's consistent epoch, sampled every {SAMPLE_EVERY_S:g} s after "
          f"{_settle(opts):.0f} s of settling; derived epochs computed in brackets")
    print(f"{'pipeline':<10} {'baseline p50':>13} {'p95':>7} {'with slow job p50':>18} {'p95':>7} {'p95 ratio':>10}")
    worst = 0.0
    for k in range(opts.pipelines):
        name = f"i{k}"
        base, loaded = [s[1] for s in runs["baseline"][name]], [s[1] for s in runs["slow"][name]]
        ratio = _p(loaded, 0.95) / _p(base, 0.95) if base and loaded else float("nan")
        if k:
            worst = max(worst, ratio)
        note = "  <- the slow job's pipeline" if k == 0 else ""
        print(f"{name:<10} {_p(base, 0.5):>11.2f} s {_p(base, 0.95):>5.2f} s ({epochs['baseline'][name]:>3}) "
              f"{_p(loaded, 0.5):>9.2f} s {_p(loaded, 0.95):>5.2f} s ({epochs['slow'][name]:>3}) {ratio:>8.2f}x{note}")
    met = worst <= 1.2 and not checks
    print(f"goal: every other pipeline's p95 within 1.2x of its baseline: worst {worst:.2f}x, {verdict(worst <= 1.2)}")
    print(f"consistent reads at the end (every pipeline, both runs): "
          f"{'all consistent' if not checks else 'FAILED: ' + '; '.join(checks)}")
    return met


# -- cost per job ------------------------------------------------------------------------------------------

@dataclass
class Cost:
    label: str
    jobs: int
    requests: int
    epochs: int
    seconds: float

    @property
    def per_epoch(self) -> float:
        return self.requests / self.epochs if self.epochs else float("nan")

    @property
    def per_second(self) -> float:
        return self.requests / self.jobs / self.seconds


def _window(server, seconds: float) -> tuple[int, float, float]:
    """Requests the server received during ``seconds`` (without the two ``mntr`` reads), and the window."""
    first = packets_received(server)
    start = time.time()
    time.sleep(seconds)
    last = packets_received(server)
    return last - first - 1, start, time.time()


def _commits_in(stamps_ms: Iterable[int], start: float, end: float) -> int:
    return sum(start * 1000 <= s <= end * 1000 for s in stamps_ms)


def cost_real(opts: argparse.Namespace, server, jobs: int) -> Cost:
    chains = [streaming_chain(f"c{k}") for k in range(max(1, jobs // 2))]
    with Deployment(server, f"cost-{jobs}", chains, opts) as run:
        every = [j for c in chains for j in c.jobs]
        per = opts.writers_per_process
        for first in range(0, len(every), per):
            run.start(every[first:first + per], f"driver-{first // per}")
        run.wait_consistent(timeout=900)
        time.sleep(_settle(opts))
        run.cache.close()
        run.tm.close()  # the bench's own session (its reads, watches and pings) is gone during the window
        requests, start, end = _window(server, opts.cost_seconds)
        from coordinator import Tidemark
        run.tm = Tidemark.connect(run.zk, operation_timeout=120)
        run.cache = run.tm.tidemark_cache()
        run.stop()
        committed = sum(_commits_in((e["end_ms"] for e in run.events(j)), start, end) for j in every)
        return Cost(f"{len(every)} real", len(every), requests, committed, end - start)


def cost_simulated(opts: argparse.Namespace, server, jobs: int) -> Cost:
    from coordinator import Tidemark
    from coordinator.records import TableTidemark
    home = Path(tempfile.mkdtemp(prefix="tidemark-bench-scale-sim-"))
    zk = f"{server.connect_string}/scale-sim-{jobs}"
    tm = Tidemark.connect(zk, operation_timeout=300)
    procs: list[subprocess.Popen] = []
    try:
        tm.barriers.ensure_grid(opts.interval_ms)
        specs: list[dict[str, Any]] = []
        for k in range(max(1, jobs // 2)):
            events, summary = f"{CATALOG}.s{k}.events", f"{CATALOG}.s{k}.summary"
            specs += [{"job": f"s{k}-root", "sources": [], "sink": events},
                      {"job": f"s{k}-derived", "sources": [events], "sink": summary}]
        started = time.perf_counter()
        for spec in specs:
            tm.register_job(spec["job"], sources=spec["sources"], sinks=[spec["sink"]])
        print(f"  ({len(specs)} simulated jobs registered in {time.perf_counter() - started:.1f} s)", flush=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        count = max(1, min(opts.sim_processes, len(specs) // 2))
        outs = []
        for p in range(count):
            chains = [specs[i:i + 2] for i in range(0, len(specs), 2)][p::count]  # a chain stays in one process
            out = home / f"sim-{p}.json"
            outs.append(out)
            config = {"zk": zk, "interval_ms": opts.interval_ms, "grace_ms": opts.grace_ms, "computed": True,
                      "jobs_per_session": opts.jobs_per_session, "out": str(out),
                      "jobs": [s for c in chains for s in c]}
            with open(home / f"sim-{p}.log", "w") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "bench.scale", "--sim-driver", json.dumps(config)],
                                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                              start_new_session=True))
        sinks = [s["sink"] for s in specs]
        deadline = time.monotonic() + 900
        while True:
            marks = tm.tidemarks(sinks)
            if all(isinstance(m, TableTidemark) and m.epoch is not None for m in marks.values()):
                break
            for p, proc in enumerate(procs):
                if proc.poll() is not None:
                    raise RuntimeError(f"simulation process {p} exited with {proc.returncode}:\n"
                                       + (home / f"sim-{p}.log").read_text(errors="replace")[-3000:])
            if time.monotonic() > deadline:
                raise RuntimeError("the simulated jobs did not all commit an epoch within 900 s")
            time.sleep(1.0)
        time.sleep(_settle(opts))
        tm.close()
        requests, start, end = _window(server, opts.cost_seconds)
        tm = Tidemark.connect(zk, operation_timeout=300)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for p, proc in enumerate(procs):
            if proc.wait(180) != 0:
                print(f"  simulation process {p} exited with {proc.returncode}:\n"
                      + (home / f"sim-{p}.log").read_text(errors="replace")[-2000:], flush=True)
        committed = 0
        for out in outs:
            for stamps in json.loads(out.read_text()).values():
                committed += _commits_in(stamps, start, end)
        return Cost(f"{len(specs)} simulated", len(specs), requests, committed, end - start)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        tm.close()
        shutil.rmtree(home, ignore_errors=True)


def cost(opts: argparse.Namespace, server) -> bool:
    header(f"cost per job: ZooKeeper requests per job per epoch, counted by the server over {opts.cost_seconds:g} s, "
           f"{opts.interval_ms} ms grid; real jobs: {', '.join(map(str, opts.jobs))}; simulated: "
           f"{', '.join(map(str, opts.simulated))}")
    print("real: root -> derived chains of EpochWriters computing every epoch, "
          f"{opts.writers_per_process} per driver process; simulated: the writer's wait loop and epoch "
          "transitions (begin, precommit, commit) with no Iceberg")
    results = []
    for jobs in opts.jobs:
        results.append(cost_real(opts, server, jobs))
        _print_cost(results[-1], first=len(results) == 1)
    for jobs in opts.simulated:
        results.append(cost_simulated(opts, server, jobs))
        _print_cost(results[-1], first=False)
    per_epoch = [r.per_epoch for r in results]
    worst, spread = max(per_epoch), max(per_epoch) / min(per_epoch)
    grid_epochs = opts.cost_seconds * 1000 / opts.interval_ms
    print(f"(epochs per job in the window: {', '.join(f'{r.epochs / r.jobs:.1f}' for r in results)}; "
          f"the grid had {grid_epochs:.1f})")
    print(f"goal: at most 10 requests per job per epoch: worst {worst:.1f}, {verdict(worst <= 10)}")
    print(f"goal: flat within 1.5x from {results[0].label} to {results[-1].label} jobs (baseline: the smallest run): "
          f"{per_epoch[-1] / per_epoch[0]:.2f}x (largest spread {spread:.2f}x), "
          f"{verdict(per_epoch[-1] / per_epoch[0] <= 1.5 and spread <= 1.5)}")
    return worst <= 10 and spread <= 1.5


def _print_cost(r: Cost, first: bool) -> None:
    if first:
        print(f"{'jobs':>16} {'requests':>9} {'epochs':>7} {'req/job/epoch':>14} {'req/job/s':>10}")
    print(f"{r.label:>16} {r.requests:>9} {r.epochs:>7} {r.per_epoch:>14.2f} {r.per_second:>10.2f}", flush=True)


# -- catch-up ----------------------------------------------------------------------------------------------

def catchup(opts: argparse.Namespace, server) -> bool:
    interval_s = opts.interval_ms / 1000
    header(f"catch-up: a derived job stopped for {opts.pause:g} s while its root job runs on a {opts.interval_ms} ms "
           "grid")
    chain = streaming_chain("u0")
    root, derived = chain.job("generate"), chain.job("summarize")
    with Deployment(server, "catchup", [chain], opts) as run:
        run.start([root])
        run.start([derived])
        run.wait_consistent()
        time.sleep(opts.warmup)
        run.stop([derived.name])
        stopped = time.time()
        last = run.consistent(chain)
        before = [e for e in run.events(derived) if e["ran"]]
        print(f"derived job stopped (SIGTERM, epoch finished) at epoch {last}; root job keeps running")
        time.sleep(opts.pause)
        upstream = run.cache.get([root.sink])[root.sink]
        backlog_to = upstream.epoch if upstream is not None else None
        restarted = time.time()
        run.start([derived])
        caught, covered = None, None
        deadline = time.monotonic() + max(120.0, 20 * interval_s)
        while time.monotonic() < deadline and (caught is None or covered is None):
            run.check_alive()
            epoch = run.consistent(chain)
            if covered is None and epoch is not None and backlog_to is not None and epoch >= backlog_to:
                covered = time.time()
            fresh = epoch is not None and epoch > (last or 0) and time.time() - epoch / 1000 <= interval_s
            if caught is None and fresh:
                caught = time.time()
            time.sleep(0.05)
        time.sleep(2 * interval_s)  # a little steady state after it
        run.stop()
        after = [e for e in run.events(derived) if e["ran"] and e["start_ms"] >= restarted * 1000]
        root_during = [e for e in run.events(root) if stopped * 1000 <= e["end_ms"] <= restarted * 1000]
        epoch_s = statistics.median([(e["end_ms"] - e["start_ms"]) / 1000 for e in before]) if before else float("nan")
        calls_to_cover = sum(1 for e in after if covered is not None and e["end_ms"] <= covered * 1000 + 1)
        calls_to_catch = sum(1 for e in after if caught is not None and e["end_ms"] <= caught * 1000 + 1)
        first = after[0] if after else None
        covers = _covers(run, chain, derived.sink, first["epoch"]) if first else None
        _, problem = run.check(chain)
    print(f"backlog: the root job committed {len(root_during)} epochs while the derived job was down "
          f"(baseline: a job that replays every barrier calls its function {len(root_during)} times)")
    if first is None or covered is None:
        print(f"NOT caught up within the timeout: {len(after)} calls after the restart")
        return False
    print(f"function calls after the restart to cover the backlog (up to the root's epoch {backlog_to} at the "
          f"restart): {calls_to_cover}; the first call covered {covers} root epochs and took "
          f"{(first['end_ms'] - first['start_ms']) / 1000:.2f} s (a steady-state epoch: {epoch_s:.2f} s)")
    if caught is not None:
        print(f"time from the restart (a new driver process) until now - consistent epoch <= one interval "
              f"({interval_s:g} s): {caught - restarted:.1f} s, of which {first['start_ms'] / 1000 - restarted:.1f} s "
              f"before the first call (process start, leadership, recovery); calls until then: {calls_to_catch}")
    else:
        print("never within one interval of the clock before the timeout")
    print(f"goal: 1 call covers the backlog: {verdict(calls_to_cover == 1)}")
    print(f"consistent read at the end: {'consistent' if problem is None else 'INCONSISTENT: ' + problem}")
    return calls_to_cover == 1 and problem is None


def _covers(run: Deployment, chain: Chain, table: str, epoch: int) -> Optional[int]:
    """The ``covers`` column of ``table``'s row of ``epoch`` (how many root epochs that call read)."""
    import pyarrow.compute as pc

    from coordinator import CatalogSettings
    settings = CatalogSettings.embedded(chain.home, name=CATALOG)
    rows = settings.load().load_table(settings.identifier(table)).scan().to_arrow()
    found = rows.filter(pc.equal(rows["epoch"], epoch))
    return int(found["covers"][0].as_py()) if found.num_rows else None


# -- mixed cadence ------------------------------------------------------------------------------------------

def mixed(opts: argparse.Namespace, server) -> bool:
    every_s = opts.every_ms / 1000
    header(f"mixed cadence: a streaming root -> derived cascade on a {opts.interval_ms} ms grid and a batch job at "
           f"every={opts.every_ms} ms reading it, {opts.mixed_minutes:g} min")
    if opts.every_ms % opts.interval_ms:
        raise SystemExit(f"--every-ms {opts.every_ms} must be a multiple of --interval-ms {opts.interval_ms}")
    chain = streaming_chain("m0", batch_every_ms=opts.every_ms)
    stream = [chain.job("generate").sink, chain.job("summarize").sink]
    rng = random.Random(18)
    checked = {"stream": 0, "all": 0}
    problems: list[str] = []
    lags: dict[str, list[float]] = {"stream": [], "all": []}
    with Deployment(server, "mixed", [chain], opts) as run:
        run.start_each(chain.jobs)
        started = time.time()
        run.wait_consistent([Chain(chain.name, chain.jobs[:2], home=chain.home)])
        end = started + opts.mixed_minutes * 60
        while time.time() < end:
            time.sleep(rng.uniform(0.2, 1.8) * opts.interval_ms / 1000)  # reads at random times
            run.check_alive()
            for label, tables in (("stream", stream), ("all", chain.tables)):
                lag = run.lag_s(chain, tables)
                if lag is None:
                    continue
                lags[label].append(lag)
                epoch, problem = run.check(chain, tables)
                checked[label] += 1
                if problem is not None:
                    problems.append(f"{label} at {epoch}: {problem}")
        stopping = time.time()
        run.stop()
        batch = run.events(chain.job("rollup"))
        streaming = run.events(chain.job("summarize"))
    # Points the batch job could have finished before the stop: its sources commit a point some seconds after it.
    horizon = int(stopping * 1000) - opts.grace_ms - 3 * opts.interval_ms
    off_cadence = [e["epoch"] for e in batch if e["epoch"] % opts.every_ms]
    first = batch[0]["epoch"] if batch else None
    periods = (horizon // opts.every_ms * opts.every_ms - first) // opts.every_ms + 1 if first is not None else 0
    taken = sum(1 for e in batch if e["epoch"] <= horizon)
    interval_periods = (streaming[-1]["epoch"] - streaming[0]["epoch"]) // opts.interval_ms + 1 if streaming else 0
    print(f"streaming derived job (baseline): {len(streaming)} epochs over {interval_periods} grid intervals = "
          f"{len(streaming) / max(1, interval_periods):.2f} per interval")
    print(f"batch job: {taken} epochs over {periods} cadence periods from its first to 3 intervals before the stop = "
          f"{taken / max(1, periods):.2f} per period; epochs off its cadence: {len(off_cadence)}")
    print(f"lag of the cascade's 2 tables: p50 {_p(lags['stream'], 0.5):.2f} s p95 {_p(lags['stream'], 0.95):.2f} s; "
          f"of all 3 tables: p50 {_p(lags['all'], 0.5):.2f} s p95 {_p(lags['all'], 0.95):.2f} s "
          f"(cadence {every_s:g} s)")
    print(f"consistent reads at random times: {checked['stream']} of the cascade, {checked['all']} of all 3 tables "
          f"(each read at the newest epoch they all hold, then rows and totals compared): "
          f"{'all consistent' if not problems else f'{len(problems)} INCONSISTENT: ' + '; '.join(problems[:5])}")
    once = periods > 0 and taken == periods and not off_cadence
    print(f"goal: one batch epoch per cadence period: {verdict(once)}; every read consistent: "
          f"{verdict(not problems and checked['all'] > 0)}")
    return once and not problems and checked["all"] > 0


# -- overload ------------------------------------------------------------------------------------------------

def overload(opts: argparse.Namespace, server) -> bool:
    interval_s = opts.interval_ms / 1000
    slow_s = 1.5 * interval_s
    header(f"overload: a derived job sleeping {slow_s:g} s per epoch on a {opts.interval_ms} ms grid, beside a "
           f"normal pipeline (the baseline), {opts.overload_minutes:g} min")
    slow, normal = streaming_chain("o0", slow_s), streaming_chain("o1")
    with Deployment(server, "overload", [slow, normal], opts) as run:
        run.start_each([*slow.jobs, *normal.jobs])
        run.wait_consistent()
        time.sleep(_settle(opts))
        samples = run.sample(opts.overload_minutes * 60)
        run.stop()
        durations = {c.name: [(e["end_ms"] - e["start_ms"]) / 1000 for e in run.events(c.job("summarize")) if e["ran"]]
                     for c in (slow, normal)}
        committed = {c.name: len(run.events(c.job("summarize"))) for c in (slow, normal)}
        problems = [f"{c.name}: {p}" for c in (slow, normal) for _, p in [run.check(c)] if p is not None]
    print(f"{'':<26} {'epoch time':>10} {'epochs':>7} {'lag p50':>8} {'p95':>7} {'1st half p95':>13} "
          f"{'2nd half p95':>13}")
    figures = {}
    for chain, label in ((slow, "overloaded derived job"), (normal, "baseline: normal pipeline")):
        lags = samples[chain.name]
        middle = lags[0][0] + (lags[-1][0] - lags[0][0]) / 2
        first, second = [s[1] for s in lags if s[0] < middle], [s[1] for s in lags if s[0] >= middle]
        epoch_s = statistics.median(durations[chain.name]) if durations[chain.name] else float("nan")
        p95 = _p([s[1] for s in lags], 0.95)
        figures[chain.name] = (epoch_s, p95, _p(first, 0.95), _p(second, 0.95))
        print(f"{label:<26} {epoch_s:>8.2f} s {committed[chain.name]:>7} {_p([s[1] for s in lags], 0.5):>6.2f} s "
              f"{p95:>5.2f} s {_p(first, 0.95):>11.2f} s {_p(second, 0.95):>11.2f} s")
    epoch_s, p95, first_p95, second_p95 = figures[slow.name]
    bound = 2 * epoch_s + interval_s
    bounded, flat = p95 <= bound, second_p95 <= 1.1 * first_p95
    print(f"goal: p95 <= 2 x epoch time + interval = {bound:.2f} s: {p95:.2f} s, {verdict(bounded)}; flat (2nd half "
          f"within 1.1x of the 1st): {second_p95 / first_p95:.2f}x, {verdict(flat)}")
    reads = "all consistent" if not problems else "INCONSISTENT: " + "; ".join(problems)
    print(f"consistent reads at the end: {reads}")
    return bounded and flat and not problems


# -- idle epochs ---------------------------------------------------------------------------------------------

COMMIT_TRIGGER = """
CREATE TABLE IF NOT EXISTS bench_commits (at_ms REAL, table_name TEXT, old_location TEXT, new_location TEXT);
CREATE TRIGGER IF NOT EXISTS bench_commit AFTER UPDATE OF metadata_location ON iceberg_tables
BEGIN
  INSERT INTO bench_commits VALUES ((julianday('now') - 2440587.5) * 86400000.0, NEW.table_name,
                                    OLD.metadata_location, NEW.metadata_location);
END;
"""


def _catalog_db(chain: Chain) -> Path:
    return chain.home / "catalog.db"


def _commits(chain: Chain, start: float, end: float) -> list[tuple[str, str, str]]:
    """The catalog commits of ``chain`` between ``start`` and ``end`` (wall s): (table, old, new metadata)."""
    with sqlite3.connect(_catalog_db(chain)) as db:
        rows = db.execute("SELECT table_name, old_location, new_location FROM bench_commits "
                          "WHERE at_ms BETWEEN ? AND ? ORDER BY at_ms", (start * 1000, end * 1000)).fetchall()
    return [(str(t), str(o), str(n)) for t, o, n in rows]


def _kind(old: str, new: str) -> str:
    """What a commit changed: ``snapshot`` (a new snapshot), ``marker`` (only the ``tidemark.`` properties, e.g.
    the committed-epoch marker) or ``other``."""
    def load(location: str) -> dict:
        return json.loads(Path(location.removeprefix("file://")).read_text())
    before, after = load(old), load(new)
    if {s["snapshot-id"] for s in after.get("snapshots", [])} - {s["snapshot-id"] for s in before.get("snapshots", [])}:
        return "snapshot"
    changed = {k for k in set(before.get("properties", {})) | set(after.get("properties", {}))
               if before.get("properties", {}).get(k) != after.get("properties", {}).get(k)}
    if changed and all(k.startswith("tidemark.") for k in changed) and before.get("refs") == after.get("refs"):
        return "marker"
    return "other"


def idle(opts: argparse.Namespace, server) -> bool:
    header(f"idle epochs: catalog commits per idle epoch, an unchanging root table -> root job -> derived job, "
           f"{opts.interval_ms} ms grid, {opts.idle_minutes:g} min")
    chains = [idle_chain("d0"), idle_chain("d1", marker_every_ms=opts.interval_ms)]
    with Deployment(server, "idle", chains, opts) as run:
        for chain in chains:
            with sqlite3.connect(_catalog_db(chain)) as db:
                db.executescript(COMMIT_TRIGGER)
        run.start_each(j for c in chains for j in c.jobs)
        run.wait_consistent()
        time.sleep(_settle(opts))
        start = time.time()
        time.sleep(opts.idle_minutes * 60)
        end = time.time()
        run.stop()
        rows = []
        for chain in chains:
            idle_epochs = sum(1 for j in chain.jobs for e in run.events(j)
                              if not e["ran"] and start * 1000 <= e["end_ms"] <= end * 1000)
            computed = sum(1 for j in chain.jobs for e in run.events(j)
                           if e["ran"] and start * 1000 <= e["end_ms"] <= end * 1000)
            kinds = [_kind(old, new) for _, old, new in _commits(chain, start, end)]
            minutes = len({e // 60_000 for j in chain.jobs for e in
                           [x["epoch"] for x in run.events(j) if start * 1000 <= x["end_ms"] <= end * 1000]})
            rows.append((chain, idle_epochs, computed, kinds, minutes))
    print(f"{'':<42} {'idle epochs':>11} {'commits':>8} {'markers':>8} {'snapshots':>9} {'other':>6} "
          f"{'per idle epoch':>15} {'excl. markers':>14}")
    for (_, idle_epochs, computed, kinds, _), label in zip(rows, ("Tidemark (marker round once a minute)",
                                                                       "baseline: a marker every idle epoch")):
        markers, snapshots, other = (kinds.count(k) for k in ("marker", "snapshot", "other"))
        print(f"{label:<42} {idle_epochs:>11} {len(kinds):>8} {markers:>8} {snapshots:>9} {other:>6} "
              f"{len(kinds) / max(1, idle_epochs):>15.3f} {(len(kinds) - markers) / max(1, idle_epochs):>14.3f}"
              + (f"  ({computed} computed epochs in the window)" if computed else ""))
    chain, idle_epochs, computed, kinds, minutes = rows[0]
    markers = kinds.count("marker")
    sinks = len(chain.jobs)
    rounds_ok = markers <= sinks * minutes
    stray = len(kinds) - markers
    print(f"marker rounds: {markers} marker commits over {minutes} clock minutes touched by epochs, {sinks} sinks "
          f"(at most {sinks * minutes} expected: {verdict(rounds_ok)})")
    ok = stray == 0 and computed == 0 and idle_epochs > 0 and rounds_ok
    print(f"goal: 0 catalog commits per idle epoch apart from the once-a-minute marker round: "
          f"{stray / max(1, idle_epochs):.3f}, {verdict(ok)}")
    return ok


# -- the command ----------------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[argparse.Namespace, Any], bool]] = {
    "isolation": isolation, "cost": cost, "catchup": catchup, "mixed": mixed, "overload": overload, "idle": idle}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench scale", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\nFull run: python -m bench scale (about 25 min)\n"
        "Smoke run: python -m bench scale --smoke (seconds per sub-benchmark)",
        epilog="Sub-benchmarks: " + ", ".join(SUBS) + ". Defaults are the full run's; --smoke changes them to "
               "the smoke run's: " + ", ".join(f"{k}={v}" for k, v in SMOKE.items()))
    p.add_argument("--only", action="append", choices=SUBS, help="run only this sub-benchmark (repeatable)")
    p.add_argument("--smoke", action="store_true", help="tiny parameters: a few seconds to a minute each")
    p.add_argument("--interval-ms", type=int, help="the barrier grid (full 5000)")
    p.add_argument("--grace-ms", type=int, help="root jobs' grace (full 1000)")
    p.add_argument("--rows", type=int, help="events a root job generates per epoch (full 50)")
    p.add_argument("--pipelines", type=int, help="isolation: pipelines (full 6)")
    p.add_argument("--iso-minutes", type=float, help="isolation: sampled minutes per run (full 1.5)")
    p.add_argument("--jobs", type=int, nargs="+", help="cost: real job counts (full 4 16 64)")
    p.add_argument("--simulated", type=int, nargs="*", help="cost: simulated job counts (full 1000)")
    p.add_argument("--cost-seconds", type=float, help="cost: the counting window per size (full 30)")
    p.add_argument("--writers-per-process", type=int, help="cost: writers per real driver process (full 16)")
    p.add_argument("--sim-processes", type=int, help="cost: processes for the simulated jobs (full 4)")
    p.add_argument("--jobs-per-session", type=int,
                   help="cost: simulated jobs sharing a session (full 1: a session each, like a driver)")
    p.add_argument("--pause", type=float, help="catch-up: seconds the derived job is down (full 300)")
    p.add_argument("--warmup", type=float, help="catch-up: seconds before the stop (full 30)")
    p.add_argument("--every-ms", type=int, help="mixed: the batch job's cadence (full 60000)")
    p.add_argument("--mixed-minutes", type=float, help="mixed: minutes (full 3)")
    p.add_argument("--overload-minutes", type=float, help="overload: sampled minutes (full 2)")
    p.add_argument("--idle-minutes", type=float, help="idle: counted minutes (full 1.5)")
    p.add_argument("--driver", help=argparse.SUPPRESS)
    p.add_argument("--sim-driver", help=argparse.SUPPRESS)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    opts = parser().parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if opts.driver or opts.sim_driver:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("kazoo").setLevel(logging.WARNING)
        return run_driver(json.loads(opts.driver)) if opts.driver else run_sim_driver(json.loads(opts.sim_driver))
    for key, value in (SMOKE if opts.smoke else FULL).items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    chosen = opts.only or list(SUBS)
    verdicts = {}
    with zookeeper() as server:
        for name in chosen:
            started = time.monotonic()
            verdicts[name] = RUNNERS[name](opts, server)
            print(f"({name} took {(time.monotonic() - started) / 60:.1f} min)", flush=True)
    print("\nscale: " + ", ".join(f"{n} {'met' if ok else 'MISSED'}" for n, ok in verdicts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
