"""Epochs in Iceberg metadata: the record of progress a restart resumes from, with no ZooKeeper at hand
(docs/design.md, "Iceberg is the record of progress").

Format 1 (``tidemark.format = 1``). Every snapshot Tidemark stages carries in its summary (Spark's ``MERGE INTO``
too, through Iceberg's ``CommitMetadata``; older snapshots may carry only ``wap.id = tidemark:<job>:<epoch>:<term>``,
which gives the epoch and term but no inputs)::

    tidemark.format   1
    tidemark.job      the writer job
    tidemark.epoch    the epoch (a barrier, milliseconds)
    tidemark.term     the writer's fencing term
    tidemark.inputs   {"sources":{"<table>":{"start":S,"end":E}},"batch_id":B}   (compact JSON: EpochInputs)

Table properties: ``tidemark.writer`` (the job that claimed the table), ``tidemark.term`` (the highest term that
claimed it: a publisher with a lower term is refused), ``tidemark.committed`` (the committed-epoch marker,
``EpochProgress`` JSON, written after the ZooKeeper commit of an epoch that published nothing here),
``tidemark.committed-epoch`` (the marker's epoch alone, kept for readers of the 0.1 layout) and
``tidemark.first-epoch`` (the writer's first epoch: the table has no exact state before it).

How one snapshot or property is read is here; a table's progress, the rule over them, is
``lineage.EpochLineage``'s (``committed_epoch``, ``committed_progress``). ``ancestors`` is the one walk up the
parents (over snapshots indexed by id once: pyiceberg's own lookup scans the whole list at every step), and
``newest_at_epoch``, ``newest_at_time`` and ``carrying_epoch`` pick a snapshot from a walk; the functions that take a
table apply them to ``main``, ``EpochLineage`` to a lineage indexed once. pyiceberg's ``Summary`` is read with ``.get``
only (``in`` and ``dict()`` misbehave on it).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Optional

from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from coordinator.errors import CorruptState, InputsExpired
from coordinator.names import MAX_EPOCH_MS
from coordinator.records import EpochInputs, EpochProgress

FORMAT = "1"
FORMAT_KEY = "tidemark.format"
EPOCH_KEY = "tidemark.epoch"
JOB_KEY = "tidemark.job"
TERM_KEY = "tidemark.term"
INPUTS_KEY = "tidemark.inputs"
COMMITTED_PROPERTY = "tidemark.committed"
COMMITTED_EPOCH_PROPERTY = "tidemark.committed-epoch"
FIRST_EPOCH_PROPERTY = "tidemark.first-epoch"
WRITER_PROPERTY = "tidemark.writer"
TERM_PROPERTY = "tidemark.term"
RELEASED_PROPERTY = "tidemark.released-term"  # the term ``tidemark unregister`` fenced the table with


WAP_ID_KEY = "wap.id"
WAP_PREFIX = "tidemark:"


def summary_properties(epoch: int, job: str, term: int, inputs: Optional[EpochInputs] = None) -> dict[str, str]:
    """The summary keys of a snapshot staged for ``job``'s epoch ``epoch`` under ``term``, reading ``inputs``."""
    keys = {FORMAT_KEY: FORMAT, EPOCH_KEY: str(epoch), JOB_KEY: job, TERM_KEY: str(term)}
    if inputs is not None:
        keys[INPUTS_KEY] = inputs.to_json().decode()
    return keys


def committed_properties(progress: EpochProgress) -> dict[str, str]:
    """The table properties of the committed-epoch marker for ``progress``."""
    return {FORMAT_KEY: FORMAT, COMMITTED_PROPERTY: progress.to_json().decode(),
            COMMITTED_EPOCH_PROPERTY: str(progress.epoch)}


def wap_id(epoch: int, job: str, term: int) -> str:
    """The ``spark.wap.id`` of a staged write. Spark records it in every staged snapshot's summary,
    including SQL ``MERGE INTO``, which cannot carry custom summary keys."""
    return f"{WAP_PREFIX}{job}:{epoch}:{term}"


def _wap_parts(summary: Summary) -> Optional[list[str]]:
    """``[job, epoch, term]`` of a Tidemark ``wap.id`` (None: no such wap id)."""
    wap = summary.get(WAP_ID_KEY)
    if wap is None or not wap.startswith(WAP_PREFIX):
        return None
    parts = wap[len(WAP_PREFIX):].rsplit(":", 2)
    return parts if len(parts) == 3 else None


def snapshot_epoch(snapshot: Snapshot) -> Optional[int]:
    """The epoch a snapshot belongs to: ``tidemark.epoch``, else a Tidemark ``wap.id``, else None."""
    if snapshot.summary is None:
        return None
    value = snapshot.summary.get(EPOCH_KEY)
    if value is None:
        wap = _wap_parts(snapshot.summary)
        value = wap[1] if wap else None
    try:
        return None if value is None else int(value)
    except ValueError:
        raise CorruptState(f"snapshot {snapshot.snapshot_id}: epoch {str(value)[:30]!r} is not an integer") from None


def snapshot_progress(snapshot: Snapshot) -> Optional[EpochProgress]:
    """What a snapshot records about its epoch (None: not a Tidemark snapshot); ``inputs`` is None for a
    snapshot of an older release (summary keys without inputs, or a ``wap.id`` only)."""
    summary = snapshot.summary
    if summary is None:
        return None
    epoch, job, term = summary.get(EPOCH_KEY), summary.get(JOB_KEY), summary.get(TERM_KEY)
    where = f"snapshot {snapshot.snapshot_id}"
    if epoch is None:
        wap = _wap_parts(summary)
        if wap is None:
            return None
        job, epoch, term = wap
    raw_inputs = summary.get(INPUTS_KEY)
    try:
        inputs = None if raw_inputs is None else EpochInputs.from_json(raw_inputs.encode(), f"{where} {INPUTS_KEY}")
        return EpochProgress(job=job or "", epoch=int(epoch), term=int(term or 0), inputs=inputs)
    except ValueError as exc:
        raise CorruptState(f"{where}: unreadable Tidemark summary keys ({exc})") from None


def marker_progress(table: Table) -> Optional[EpochProgress]:
    """The committed-epoch marker (a 0.1 ``tidemark.committed-epoch`` alone gives the epoch, no inputs)."""
    where = f"table {'.'.join(table.name())} property {COMMITTED_PROPERTY}"
    raw = table.properties.get(COMMITTED_PROPERTY)
    if raw is not None:
        return EpochProgress.from_json(raw.encode(), where)
    legacy = table.properties.get(COMMITTED_EPOCH_PROPERTY)
    if legacy is None:
        return None
    try:
        return EpochProgress(job=writer_job(table) or "", epoch=int(legacy), term=0)
    except ValueError:
        raise CorruptState(f"table {'.'.join(table.name())}: {COMMITTED_EPOCH_PROPERTY}={legacy[:30]!r} is not "
                           "an epoch") from None


def claimed_term(properties: Mapping[str, str]) -> int:
    """The term that claimed a table last (its ``tidemark.term`` property; 0 for none)."""
    value = properties.get(TERM_PROPERTY)
    try:
        return int(value or 0)
    except ValueError:
        raise CorruptState(f"table property {TERM_PROPERTY}={str(value)[:30]!r} is not a term") from None


def recorded_term(table: Table) -> int:
    """The highest term the table records anywhere (claims, published and staged snapshots; 0 for none)."""
    terms = [claimed_term(table.properties)]
    terms += [p.term for p in (snapshot_progress(s) for s in table.snapshots()) if p is not None]
    marker = marker_progress(table)
    return max(terms + ([marker.term] if marker else []))


def snapshot_index(table: Table) -> dict[int, Snapshot]:
    """Every snapshot of ``table`` by id."""
    return {s.snapshot_id: s for s in table.snapshots()}


def ancestors(by_id: Mapping[int, Snapshot], snapshot_id: Optional[int]) -> Iterator[Snapshot]:
    """The snapshot ``snapshot_id`` and its ancestors, newest first, until a parent is missing (expired)."""
    snapshot = by_id.get(snapshot_id) if snapshot_id is not None else None
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = by_id.get(parent) if parent is not None else None


def appended_files(table: Table, start: int, end: int) -> list[DataFile]:
    """The data files the snapshots after ``start`` up to ``end`` (``end`` and its ancestors above ``start``) added,
    oldest first: the rows appended to an append-only table in between, as Iceberg's incremental scans take them.

    A ``replace`` snapshot adds no rows: it is a compaction (a catalog's maintenance, Trino's ``optimize``,
    Spark's ``rewrite_data_files``) rewriting rows already there into new files, so telling the rows apart by the
    files two snapshots list would count them again. Each snapshot's own ADDED entries are read instead, from the
    manifests it wrote. ``InputsExpired`` when a snapshot in between is gone from the table (expired outside
    Tidemark: its GC keeps them while a job still has to read them), since what it appended cannot be known.
    """
    added = snapshots_after(snapshot_index(table), start, end)
    if added is None:
        raise InputsExpired(f"table {'.'.join(table.name())}: its history from snapshot {start} to {end} was expired "
                            "outside Tidemark, so the rows appended in between cannot be told. When a catalog or "
                            "another engine expires snapshots, keep those younger than the longest lag of the jobs "
                            "reading the table (README: \"Maintenance run by your catalog or other engines\")")
    files: list[DataFile] = []
    for snapshot in reversed(added):
        if snapshot.summary is not None and snapshot.summary.operation == Operation.REPLACE:
            continue
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            files.extend(entry.data_file for entry in manifest.fetch_manifest_entry(table.io)
                         if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id)
    return files


def snapshots_after(by_id: Mapping[int, Snapshot], start: int, end: int) -> Optional[list[Snapshot]]:
    """``end`` and its ancestors down to the child of ``start``, newest first: the snapshots after ``start`` up to
    ``end``. ``start`` itself need not be there any more (age-based expiry removes it first; Iceberg keeps its id as
    its child's parent). None when one in between is gone, or ``start`` is not an ancestor of ``end``."""
    added: list[Snapshot] = []
    for snapshot in ancestors(by_id, end):
        added.append(snapshot)
        if snapshot.parent_snapshot_id == start:
            return added
    return None


def main_lineage(table: Table) -> Iterator[Snapshot]:
    """``main``'s snapshots, newest first."""
    return ancestors(snapshot_index(table), table.metadata.current_snapshot_id)


def newest_at_epoch(lineage: Iterable[Snapshot], epoch: int,
                    epochs: Optional[Iterable[Optional[int]]] = None) -> Optional[Snapshot]:
    """The first snapshot of ``lineage`` (newest first) with ``tidemark.epoch <= epoch``: the table's state at an
    epoch it holds (None: it had no Tidemark snapshot then, so it reads as empty). ``epochs``: the lineage's
    epochs already parsed (``snapshot_epoch`` of each snapshot, in the same order)."""
    pairs = zip(lineage, epochs) if epochs is not None else ((s, snapshot_epoch(s)) for s in lineage)
    for snapshot, found in pairs:
        if found is not None and found <= epoch:
            return snapshot
    return None


def newest_at_time(lineage: Iterable[Snapshot], wall_ms: int) -> Optional[Snapshot]:
    """The first snapshot of ``lineage`` (newest first) committed at or before ``wall_ms``."""
    return next((s for s in lineage if s.timestamp_ms <= wall_ms), None)


def carrying_epoch(lineage: Iterable[Snapshot], epoch: int,
                   epochs: Optional[Iterable[Optional[int]]] = None) -> Optional[Snapshot]:
    """The first snapshot of ``lineage`` (newest first) that carries epoch ``epoch`` itself, if any. ``epochs``: the
    lineage's epochs already parsed, as for ``newest_at_epoch``."""
    pairs = zip(lineage, epochs) if epochs is not None else ((s, snapshot_epoch(s)) for s in lineage)
    for snapshot, found in pairs:
        if found == epoch:
            return snapshot
        if found is not None and found < epoch:
            return None
    return None


def snapshot_of_epoch(table: Table, epoch: int) -> Optional[Snapshot]:
    """The snapshot of ``main``'s lineage that carries epoch ``epoch``, if any."""
    return carrying_epoch(main_lineage(table), epoch)


def snapshot_at_epoch(table: Table, epoch: int) -> Optional[Snapshot]:
    """The newest snapshot of ``main`` with ``tidemark.epoch <= epoch`` (None: the table was empty then)."""
    return newest_at_epoch(main_lineage(table), epoch)


def snapshot_at_time(table: Table, wall_ms: int) -> Optional[Snapshot]:
    """For a root table written outside Tidemark: the newest ``main`` snapshot committed at or before ``wall_ms``."""
    return newest_at_time(main_lineage(table), wall_ms)


def marker_epoch(table: Table) -> Optional[int]:
    """The committed-epoch marker's epoch (``marker_progress``'s). The marker is written as two properties in one
    commit, the whole record and its epoch alone (``committed_properties``), so the epoch is read from the second
    and the record's inputs (a range per source) are not decoded; a 0.1 table has the second only."""
    alone = table.properties.get(COMMITTED_EPOCH_PROPERTY) or ""
    if alone.isascii() and alone.isdigit() and int(alone) <= MAX_EPOCH_MS:
        return int(alone)
    marker = marker_progress(table)  # no marker, or not a plain epoch: the record's decoding says which
    return None if marker is None else marker.epoch


def is_released(properties: Mapping[str, str]) -> bool:
    """Whether the table's writer released it (``tidemark unregister``), with no leader claiming it since: its Iceberg
    records then hold every epoch ZooKeeper committed, and a reader with ZooKeeper may go by them."""
    released = properties.get(RELEASED_PROPERTY)
    return released is not None and released == properties.get(TERM_PROPERTY)


def writer_job(table: Table) -> Optional[str]:
    """``tidemark.writer``: the job that claimed the table (``claim_table``), None when no Tidemark job did."""
    return table.properties.get(WRITER_PROPERTY)


def first_epoch_property(table: Table) -> Optional[int]:
    """``tidemark.first-epoch``: the writer's first epoch as it recorded it (None: not recorded)."""
    value = table.properties.get(FIRST_EPOCH_PROPERTY)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise CorruptState(f"table {'.'.join(table.name())}: {FIRST_EPOCH_PROPERTY}={value[:30]!r} is not "
                           "an epoch") from None

