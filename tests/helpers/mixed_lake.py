"""Three jobs on one grid, driven epoch by epoch from the test (real ZooKeeper and Iceberg): tables at mixed
epochs, with the rows and the snapshot each job wrote at each epoch, the truth resolutions are checked against."""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import pyarrow as pa

from coordinator import EpochWriter
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.records import ConsistentVersion
from tests.helpers.lake import commit_rows, create_table, lead_job


def epoch_counts(frame: pa.Table) -> dict[int, int]:
    """How many rows of each epoch a table holds (the ``epoch`` column is the epoch that wrote the row)."""
    return dict(Counter(frame.column("epoch").to_pylist()))


class MixedLake:
    """``up`` and ``other`` are root jobs appending ``T // 1000`` rows of epoch ``T`` at each epoch they take;
    ``down`` reads ``up`` and appends a copy of ``up``'s changes since its previous epoch."""

    def __init__(self, catalog, settings, namespace: str) -> None:
        self.catalog, self.settings = catalog, settings
        self.up, self.down, self.other = (f"{namespace}.{t}" for t in ("up", "down", "other"))
        for name in self.tables:
            create_table(catalog, name)
        self.written: dict[str, dict[int, int]] = {t: {} for t in self.tables}  # table -> epoch of rows -> rows
        self.published: dict[str, dict[int, int]] = {t: {} for t in self.tables}  # table -> epoch -> snapshot
        self.writers: dict[str, EpochWriter] = {}

    @property
    def tables(self) -> list[str]:
        return [self.up, self.down, self.other]

    def open(self, tm) -> None:
        self.writers = {self.up: lead_job(tm, self.settings, "up", [self.up]),
                        self.down: lead_job(tm, self.settings, "down", [self.down], sources=(self.up,)),
                        self.other: lead_job(tm, self.settings, "other", [self.other])}

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    def root_epoch(self, table: str, epoch: int, rows: Optional[int] = None) -> None:
        """``table``'s job takes ``epoch``, appending ``rows`` rows (``epoch // 1000`` unless given)."""
        count = epoch // 1000 if rows is None else rows
        self.published[table][epoch] = commit_rows(self.writers[table], epoch, rows=count)
        self.written[table][epoch] = count

    def copy_epoch(self, epoch: int) -> None:
        """``down`` takes ``epoch`` (``up`` must hold it): one epoch copying every change of ``up`` since its last."""
        writer = self.writers[self.down]
        last = writer.epochs.last_committed
        record = writer.process(epoch, lambda ctx: ctx.append(self.down, ctx.changes(self.up)),
                                inputs=writer.inputs_for(epoch))
        published = record.published[self.down]
        assert published is not None
        self.published[self.down][epoch] = published
        for e, n in self.written[self.up].items():
            if (last is None or e > last) and e <= epoch:
                self.written[self.down][e] = n

    def truth(self, tables: tuple[str, ...]) -> ConsistentVersion:
        """The newest epoch every table of ``tables`` published, each table at the snapshot it published there."""
        epoch = max(set.intersection(*(set(self.published[t]) for t in tables)))
        return ConsistentVersion(epoch, {t: self.published[t][epoch] for t in tables})

    def sets(self) -> list[tuple[str, ...]]:
        return [(self.up, self.down), (self.up, self.other), (self.down, self.other), (self.up, self.down, self.other)]

    def check(self, resolver: Resolver, version: ConsistentVersion) -> None:
        """Every table of ``version`` holds exactly the rows of the epochs up to the version's."""
        assert version.epoch is not None
        for name, frame in read_arrow(resolver, version).items():
            expected = {e: n for e, n in self.written[name].items() if e <= version.epoch}
            assert epoch_counts(frame) == expected, f"{name} read at version {version.epoch}"


class MovingPipeline:
    """``lake``'s ``up`` and ``down`` each taking one more epoch, again and again, in a thread while it runs
    (``start`` to ``stop``, again and again; ``running`` as a context): a served version that moves all the time."""

    def __init__(self, lake: MixedLake, epoch: int = 1000, pause_s: float = 0.0) -> None:
        """``pause_s``: between epochs (a long run's tables stay small enough to read quickly)."""
        self.lake, self.epoch, self.pause_s = lake, epoch, pause_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.step()

    def step(self) -> None:
        self.lake.root_epoch(self.lake.up, self.epoch)
        self.lake.copy_epoch(self.epoch)
        self.epoch += 1000

    def _run(self) -> None:
        while not self._stop.wait(self.pause_s):
            self.step()

    def start(self) -> MovingPipeline:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="moving-pipeline", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    @contextmanager
    def running(self) -> Iterator[MovingPipeline]:
        """Moving while the block runs, still after it (a module's tables grow only while its tests read)."""
        self.start()
        try:
            yield self
        finally:
            self.stop()
