"""Jobs at rest on purpose: an operator pauses or retires a job, and resumes it.

    tm.pause_job("word_counts", reason="weekend", until_ms=now_ms() + 48 * 3600_000)
    tm.retire_job("backfill_2025", reason="one-off, done")    # refused while a live leader runs it
    tm.resume_job("word_counts")                               # "paused", "retired" or None

A job with no live leader is either *at rest* (it finished a bounded run, or an operator paused
or retired it) or stale: ``coordinator.protocol.status`` flags only stale jobs, and the
consistent lag of what is live leaves out the tables of jobs at rest. These marks are how an
operator says "nobody runs this job now, on purpose" for a stream stopped for maintenance, or a
pipeline taken out of service whose tables stay readable at their last epoch (unlike
``unregister``, retiring keeps the job's registration, its claim on its sinks and its tidemarks,
so consistent reads of its tables go on as before).

- ``/jobs/<job>/paused`` (``RestRecord``): until ``until_ms`` (None: until resumed). It counts
  only while no live leader runs the job: a job being run is live whatever its marks say. So
  pausing a job that a leader runs now takes effect once its drivers stop: pause, then stop them,
  and no alert fires in between, even when a standby takes over during the shutdown. A leader
  does not remove it (it does remove ``/jobs/<job>/finished``): the pause stays the operator's
  statement until ``tidemark resume`` or its end, so give ``until_ms`` (``--for``) when the job
  should be watched again by itself.
- ``/jobs/<job>/retired`` (``RestRecord``): refused while the job has a live, unfenced leader;
  a driver that becomes the job's leader while it is retired steps down, and its ``run()`` raises
  ``JobRetired``.

Each change is one multi that checks the job's term znode version, so a leader elected while
``retire`` checked for one makes the multi fail; it is then decided again (tenacity, within the
session's operation timeout).
"""
from __future__ import annotations

from typing import Any, Optional

from coordinator.errors import JobNotFound, JobRetired, MultiFailed, RegistrationError
from coordinator.names import validate_name
from coordinator.protocol.registry import TermMoved, retry_term_change
from coordinator.records import LeaderRecord, RestRecord, TermRecord
from coordinator.zookeeper.ops import Check, Create, Delete, Op, SetData
from coordinator.zookeeper.session import ZooKeeperSession

PAUSED, RETIRED = "paused", "retired"


def pause_job(tm: ZooKeeperSession, name: str, *, by: str = "operator", reason: str = "",
              until_ms: Optional[int] = None) -> RestRecord:
    """Mark ``name`` paused (replacing a retirement or an earlier pause); returns the record written.
    ``InvalidArgument`` for an ``until_ms`` that is not after now."""
    record = RestRecord(by, reason, until_ms=until_ms)  # validates every argument, until_ms after its since_ms
    _mark(tm, name, PAUSED, record, refuse_leader=False)
    return record


def retire_job(tm: ZooKeeperSession, name: str, *, by: str = "operator", reason: str = "") -> RestRecord:
    """Mark ``name`` retired (replacing a pause); ``RegistrationError`` while a live, unfenced leader runs it."""
    record = RestRecord(by, reason)
    _mark(tm, name, RETIRED, record, refuse_leader=True)
    return record


def resume_job(tm: ZooKeeperSession, name: str) -> Optional[str]:
    """Remove a pause or a retirement; returns which one was removed (None: the job was neither)."""
    validate_name(name, "job name")
    p = tm.paths

    def attempt() -> Optional[str]:
        term = _term(tm, name)
        found = [(kind, path) for kind, path in ((PAUSED, p.paused(name)), (RETIRED, p.retired(name)))
                 if tm.get(path) is not None]
        if found:
            _apply(tm, [Check(p.term(name), term[1].version), *(Delete(path) for _, path in found)])
        return found[0][0] if found else None
    return retry_term_change(tm, f"changing job {name!r}", attempt)


def refuse_retired(tm: ZooKeeperSession, name: str) -> None:
    """``JobRetired`` when an operator retired ``name`` (a driver calls it once it leads)."""
    found = tm.read(tm.paths.retired(name), RestRecord)
    if found is not None:
        record = found[0]
        why = f" ({record.reason})" if record.reason else ""
        raise JobRetired(f"job {name!r} was retired by {record.by}{why}: its drivers may not lead it; "
                         f"`tidemark resume {name}` to run it again")


def _mark(tm: ZooKeeperSession, name: str, kind: str, record: RestRecord, refuse_leader: bool) -> None:
    validate_name(name, "job name")
    p = tm.paths
    path, other = (p.paused(name), p.retired(name)) if kind == PAUSED else (p.retired(name), p.paused(name))

    def attempt() -> None:
        term = _term(tm, name)
        if refuse_leader:
            leader = tm.read(p.leader(name), LeaderRecord)
            if leader is not None and leader[0].term >= term[0].term:
                raise RegistrationError(
                    f"job {name!r} has a live leader ({leader[0].member} on {leader[0].host}, term "
                    f"{leader[0].term}): stop its drivers first (a retired job is one nobody runs), or pause it")
        ops: list[Op] = [Check(p.term(name), term[1].version)]
        if tm.get(other) is not None:
            ops.append(Delete(other))
        data = record.to_json()
        ops.append(SetData(path, data) if tm.get(path) is not None else Create(path, data))
        _apply(tm, ops)
    retry_term_change(tm, f"changing job {name!r}", attempt)


def _term(tm: ZooKeeperSession, name: str) -> tuple[TermRecord, Any]:
    found = tm.read(tm.paths.term(name), TermRecord)
    if found is None:
        raise JobNotFound(f"job {name!r} is not registered (see `tidemark status`)")
    return found


def _apply(tm: ZooKeeperSession, ops: list[Op]) -> None:
    try:
        tm.multi(ops)
    except MultiFailed:
        raise TermMoved() from None


__all__ = ["PAUSED", "RETIRED", "pause_job", "refuse_retired", "resume_job", "retire_job"]
