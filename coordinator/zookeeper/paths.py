"""Every ZooKeeper path Tidemark uses, built in this one module from validated names.

Paths are relative to the client's chroot-free root (``root``, default ``/tidemark``).
"""
from __future__ import annotations

from dataclasses import dataclass

from coordinator.errors import InvalidName
from coordinator.names import validate_epoch, validate_name


@dataclass(frozen=True)
class Paths:
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
        return self._join("topology")

    @property
    def jobs(self) -> str:
        return self._join("jobs")

    def job(self, job: str) -> str:
        return self._join("jobs", validate_name(job, "job name"))

    def term(self, job: str) -> str:
        return self.job(job) + "/term"

    def incarnation(self, job: str, incarnation: str) -> str:
        """Exists exactly while the registration ``incarnation`` of ``job`` does (never re-created)."""
        return self.job(job) + "/incarnation-" + validate_name(incarnation, "incarnation id")

    def leader(self, job: str) -> str:
        return self.job(job) + "/leader"

    def election(self, job: str) -> str:
        return self.job(job) + "/election"

    def finished(self, job: str) -> str:
        return self.job(job) + "/finished"

    def paused(self, job: str) -> str:
        """An operator paused the job (``RestRecord``), until ``tidemark resume`` or the pause's end."""
        return self.job(job) + "/paused"

    def retired(self, job: str) -> str:
        """An operator retired the job (``RestRecord``): its drivers refuse to lead it until ``tidemark resume``."""
        return self.job(job) + "/retired"

    def pacing(self, job: str) -> str:
        return self.job(job) + "/pacing"

    def epochs(self, job: str) -> str:
        return self.job(job) + "/epochs"

    def epoch(self, job: str, epoch: int) -> str:
        return f"{self.epochs(job)}/{_epoch_segment(epoch)}"

    @property
    def tables(self) -> str:
        return self._join("tables")

    def table(self, table: str) -> str:
        return self._join("tables", validate_name(table, "table name"))

    def tidemark(self, table: str) -> str:
        return self.table(table) + "/tidemark"

    @property
    def barriers(self) -> str:
        return self._join("barriers")

    @property
    def versions(self) -> str:
        return self._join("versions")

    def version(self, epoch: int) -> str:
        return f"{self.versions}/{_epoch_segment(epoch)}"

    @property
    def gc(self) -> str:
        return self._join("gc")

    @property
    def gc_lock(self) -> str:
        return self.gc + "/lock"

    @property
    def readers(self) -> str:
        return self._join("readers")

    def reader(self, reader_id: str) -> str:
        return self._join("readers", validate_name(reader_id, "reader id"))

    def job_owned(self, path: str) -> bool:
        """Whether ``path`` belongs to one job (``/jobs/<job>/...``, ``/tables/<sink>/...``): a job with its own
        identity gives it its ACL and the operator's; everything else is deployment-wide."""
        return path.startswith((self.jobs + "/", self.tables + "/"))

    def top_level(self) -> tuple[str, ...]:
        return (self.jobs, self.tables, self.barriers, self.versions, self.readers)


def _epoch_segment(epoch: int) -> str:
    return str(validate_epoch(epoch))
