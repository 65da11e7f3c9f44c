"""Every ZooKeeper path Tidemark uses, built in this one module from validated names.

Paths are relative to the client's chroot-free root (``root``, default ``/tidemark``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from coordinator.errors import InvalidName
from coordinator.names import validate_epoch, validate_name


@dataclass(frozen=True)
class Paths:
    """Every znode path of one Tidemark tree under ``root`` (default ``/tidemark``), built from validated names.

        paths = Paths("/tidemark")                  # session.paths
        paths.tidemark("lake.db.word_counts")       # "/tidemark/tables/lake.db.word_counts/tidemark"
        paths.epoch("word_counts", 1700000000000)   # "/tidemark/jobs/word_counts/epochs/1700000000000"

    Znodes: it names them all and creates none (``docs/design.md``, "ZooKeeper layout", says what each holds).

    Failure behaviour: ``InvalidName`` for a root that is not an absolute znode path without a trailing ``/``, or
    that has an unsafe segment, and for a job, table, reader or incarnation name or an epoch that is not safe in
    a path. It makes no request.
    """

    root: str = "/tidemark"

    def __post_init__(self) -> None:
        if (not isinstance(self.root, str) or not self.root.startswith("/")
                or (self.root.endswith("/") and self.root != "/")):
            raise InvalidName(f"root {self.root!r} must be an absolute znode path without a trailing '/'")
        for segment in self.root.strip("/").split("/"):
            if segment:
                validate_name(segment, "root path segment")

    def _join(self, *parts: str) -> str:
        base = "" if self.root == "/" else self.root
        return base + "/" + "/".join(parts)

    @property
    def topology(self) -> str:
        """``/topology``: the topology's version (``TopologyVersion``), bumped by every registration change."""
        return self._join("topology")

    @property
    def jobs(self) -> str:
        """``/jobs``: one child per registered job."""
        return self._join("jobs")

    def job(self, job: str) -> str:
        """``/jobs/<job>``: the job's sources and sinks (``JobRecord``)."""
        return self._join("jobs", validate_name(job, "job name"))

    def term(self, job: str) -> str:
        """``/jobs/<job>/term``: the fencing counter (``TermRecord``)."""
        return self.job(job) + "/term"

    def incarnation(self, job: str, incarnation: str) -> str:
        """Exists exactly while the registration ``incarnation`` of ``job`` does (never re-created)."""
        return self.job(job) + "/incarnation-" + validate_name(incarnation, "incarnation id")

    def leader(self, job: str) -> str:
        """``/jobs/<job>/leader`` (ephemeral): who leads the job, under which term (``LeaderRecord``)."""
        return self.job(job) + "/leader"

    def election(self, job: str) -> str:
        """``/jobs/<job>/election``: the leadership contenders (kazoo's ``Lock`` recipe)."""
        return self.job(job) + "/election"

    def finished(self, job: str) -> str:
        """``/jobs/<job>/finished``: the job's last leader ended a bounded run (``FinishedRecord``)."""
        return self.job(job) + "/finished"

    def paused(self, job: str) -> str:
        """An operator paused the job (``RestRecord``), until ``tidemark resume`` or the pause's end."""
        return self.job(job) + "/paused"

    def retired(self, job: str) -> str:
        """An operator retired the job (``RestRecord``): its drivers refuse to lead it until ``tidemark resume``."""
        return self.job(job) + "/retired"

    def pacing(self, job: str) -> str:
        """``/jobs/<job>/pacing``: the cadence and grace the job's leader runs with."""
        return self.job(job) + "/pacing"

    def epochs(self, job: str) -> str:
        """``/jobs/<job>/epochs``: one child per epoch record kept."""
        return self.job(job) + "/epochs"

    def epoch(self, job: str, epoch: int) -> str:
        """``/jobs/<job>/epochs/<T>``: epoch ``T`` of the job (``EpochRecord``)."""
        return f"{self.epochs(job)}/{_epoch_segment(epoch)}"

    @property
    def tables(self) -> str:
        """``/tables``: one child per table a registered job writes."""
        return self._join("tables")

    def table(self, table: str) -> str:
        """``/tables/<table>``: the table's writer job and Iceberg identity (``TableRecord``)."""
        return self._join("tables", validate_name(table, "table name"))

    def tidemark(self, table: str) -> str:
        """``/tables/<table>/tidemark``: the table's committed epochs (``TableTidemark``)."""
        return self.table(table) + "/tidemark"

    @property
    def barriers(self) -> str:
        """``/barriers``: the barrier grid (``BarrierGrid``)."""
        return self._join("barriers")

    @property
    def versions(self) -> str:
        """``/versions``: the retention policy; its children are the retained versions."""
        return self._join("versions")

    def version(self, epoch: int, pipeline: Optional[str] = None) -> str:
        """``/versions/<T>-<pipeline>``: the consistent version pipeline ``pipeline`` retained at epoch ``T``
        (``/versions/<T>`` with no pipeline: an earlier release's, across every pipeline)."""
        segment = _epoch_segment(epoch)
        return f"{self.versions}/{segment}" if pipeline is None else \
            f"{self.versions}/{segment}-{validate_name(pipeline, 'pipeline')}"

    @property
    def gc(self) -> str:
        """``/gc``: the last scheduled GC run."""
        return self._join("gc")

    @property
    def gc_lock(self) -> str:
        """``/gc/lock``: held by the one GC run at a time."""
        return self.gc + "/lock"

    @property
    def readers(self) -> str:
        """``/readers``: one ephemeral child per live reader's pins."""
        return self._join("readers")

    def reader(self, reader_id: str) -> str:
        """``/readers/<id>`` (ephemeral): the versions a live reader pinned (``ReaderPins``)."""
        return self._join("readers", validate_name(reader_id, "reader id"))

    def job_owned(self, path: str) -> bool:
        """Whether ``path`` belongs to one job (``/jobs/<job>/...``, ``/tables/<sink>/...``): a job with its own
        identity gives it its ACL and the operator's; everything else is deployment-wide."""
        return path.startswith((self.jobs + "/", self.tables + "/"))

    def top_level(self) -> tuple[str, ...]:
        """The top-level znodes a session creates (``ZooKeeperSession.ensure_layout``), beside ``/topology``."""
        return (self.jobs, self.tables, self.barriers, self.versions, self.readers)


def _epoch_segment(epoch: int) -> str:
    return str(validate_epoch(epoch))
