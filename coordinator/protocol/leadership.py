"""Leadership of one job among its driver replicas, with a fencing term.

    leadership = tm.leadership("word_counts")
    term = leadership.acquire(term_floor=t)   # a standby replica blocks here until it wins; term > t
    leadership.transact([SetData(...)])      # = multi(Check(term, version), Check(incarnation), ...)
    leadership.release()

States: ``IDLE -> CONTENDING -> LEADING <-> SUSPENDED``, then ``LOST`` (session expired),
``FENCED`` (the term moved on: a newer leader or an operator) or ``RELEASED`` (``LeaderState``).

Contention uses kazoo's ``Lock`` recipe under ``/jobs/<job>/election``. The winner takes the next
term, and every later write of the leader goes through ``transact``, checked against the term
znode's version and the registration it was elected in: a zombie, an old leader whose session
expired while it was paused, can never change anything and gets ``Fenced``. Terms never go
backwards: the new term is above both the term znode and ``term_floor``, which a writer reads
from its sinks' Iceberg metadata (``Leadership``; ``docs/design.md``, "Monotonic fencing").

Failure behaviour (Curator's rules): on SUSPENDED the leader stops committing at once
(``transact`` waits at most a session timeout, then raises ``NotLeader``) until the connection
comes back with the same session; on LOST it is over (``Fenced``): release and contend again
with a new ``Leadership``. The state listener only flips the state; it never blocks. A contender
node left behind is deleted by the session's next ``acquire`` (``Leadership``).
"""
from __future__ import annotations

import enum
import socket
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Optional

from kazoo.client import KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    LockTimeout,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.recipe.lock import Lock

from coordinator.errors import Fenced, JobNotFound, MultiFailed, NotLeader, TidemarkError, ZooKeeperUnavailable
from coordinator.names import validate_name
from coordinator.records import JobRecord, LeaderRecord, TermRecord
from coordinator.zookeeper.ops import Check, Create, Delete, Op, SetData
from coordinator.zookeeper.races import Raced
from coordinator.zookeeper.session import ZooKeeperSession


class LeaderState(str, enum.Enum):
    """Where a ``Leadership`` stands: ``IDLE -> CONTENDING -> LEADING <-> SUSPENDED``, then ``LOST``, ``FENCED``
    or ``RELEASED``.

    ``IDLE``: not contending (new, or its last ``acquire`` failed). ``CONTENDING``: in ``acquire``, waiting for
    the lock or taking the term. ``LEADING``: it holds the term and may write. ``SUSPENDED``: it leads, but the
    connection dropped: nothing is written until the connection is back with the same session (``LEADING``
    again) or the session expires. ``LOST``: the session expired while it contended or led; its leadership is
    over. ``FENCED``: a write's check, or ``confirm``, found the term or the registration moved on (a newer
    leader, an operator's fence, an unregistration). ``RELEASED``: it stepped down (``release``).
    """

    IDLE = "IDLE"
    CONTENDING = "CONTENDING"
    LEADING = "LEADING"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"
    FENCED = "FENCED"
    RELEASED = "RELEASED"


# Per session, the election nodes a Leadership of it gave up on and has not seen deleted yet: it deletes them before
# contending again (see ``Leadership``). Leaderships run on any thread, hence the lock.
_ABANDONED: weakref.WeakKeyDictionary[ZooKeeperSession, set[str]] = weakref.WeakKeyDictionary()
_ABANDONED_LOCK = threading.Lock()


def current_leader(tm: ZooKeeperSession, job: str) -> Optional[LeaderRecord]:
    """Who leads ``job`` now, as its ``/jobs/<job>/leader`` znode says (None: nobody)."""
    path = tm.paths.leader(job)
    found = tm.get(path)
    return None if found is None else LeaderRecord.from_json(found[0], path)


def leader_since_ms(tm: ZooKeeperSession, job: str) -> Optional[int]:
    """When ``job``'s current leader took over, by ZooKeeper's clock: its leader znode's creation time (None: no
    leader)."""
    found = tm.get(tm.paths.leader(job))
    return None if found is None else found[1].ctime


class Leadership:
    """One replica's contention for the leadership of ``job``, and the fencing term it won
    (``Tidemark.leadership`` makes one); ``with leadership:`` acquires (no timeout) and releases.

        leadership = tm.leadership("word_counts")
        term = leadership.acquire(timeout=60, term_floor=t)   # NotLeader if not elected within 60 s; term > t
        leadership.transact([SetData(path, data)])           # only while it still holds that term
        leadership.release()

    Znodes: contenders under ``/jobs/<job>/election`` (kazoo's ``Lock`` recipe, a fresh contender for every
    ``acquire``), ``/jobs/<job>/term`` and the ephemeral ``/jobs/<job>/leader``. The winner sets the term to
    ``max(term, term_floor) + 1`` with a version-checked set and creates ``/leader`` in the same multi, which
    also checks that its contender node still exists (a winner whose session expired meanwhile, its node gone
    with it, takes no term) and that ``/jobs/<job>/incarnation-<id>`` of the registration it read still does.
    Every later write carries two checks (``fencing_checks``): the term znode's version, which an
    operator's ``fence`` or a newer leader bumps, and the incarnation, which unregistering deletes.

    States: ``state``, a ``LeaderState``, flipped by a session state listener that never blocks.

    Failure behaviour: ``acquire`` raises ``JobNotFound``, ``NotLeader``, ``PermissionDenied`` or
    ``ZooKeeperUnavailable`` (``ZooKeeperRebuilt`` for a session that can never come back). While the connection
    is SUSPENDED nothing is written (``transact`` waits at most a session timeout, then raises ``NotLeader``);
    once the session is LOST or a check fails, ``Fenced``: release and contend again with a new ``Leadership``.
    A contender node given up on must not stay: kazoo's recipe deletes it best-effort and swallows the error
    while the connection is SUSPENDED (kazoo #732), and a node left so by a session that survives blocks every
    later contender, this replica included. So every node a ``Leadership`` of the session gave up on is
    remembered for the session until it is seen deleted, and every ``acquire`` first deletes those still there.
    ``release`` deletes its own node within the session's operation deadline (kazoo's ``release`` waits with none
    while the connection is down), and leaves it to the next ``acquire`` if that fails.
    """

    def __init__(self, tm: ZooKeeperSession, job: str) -> None:
        self.tm = tm
        self.job = validate_name(job, "job name")
        self.state = LeaderState.IDLE
        self.term: Optional[int] = None
        self._term_version: Optional[int] = None
        self._incarnation: Optional[str] = None
        self._lock: Optional[Lock] = None
        self._state_lock = threading.Condition()

    # -- contention -------------------------------------------------------------------------

    def acquire(self, timeout: Optional[float] = None, term_floor: int = 0) -> int:
        """Block until this replica leads the job (or ``timeout`` passes: ``NotLeader``); returns the term,
        which is above ``term_floor`` and every term this registration handed out.

        :param timeout: seconds to wait for the lock (None: no limit); kazoo's ``acquire`` also waits while the
            connection is down, for as long as it is (the session logs each connection state change).
        :param term_floor: a term the new one must exceed: the highest its sinks' Iceberg metadata records.
        :raises JobNotFound: the job is not registered, or was unregistered while this replica contended.
        :raises NotLeader: not elected within ``timeout``, or the session expired or the job was unregistered
            (perhaps registered again) before this replica took the term.
        :raises PermissionDenied: the job's znodes are another job identity's.
        :raises ZooKeeperUnavailable: kazoo's lock recipe gave up (``ZooKeeperRebuilt``: the session never comes
            back), or taking the term kept racing for ``operation_timeout``.
        """
        found = self.tm.read(self.tm.paths.job(self.job), JobRecord)
        if found is None:
            raise JobNotFound(f"job {self.job!r} is not registered: register_job() it first")
        self._incarnation = found[0].incarnation
        self._sweep_abandoned()
        # A fresh contender each time: a recipe object whose last acquire or release failed half-way can
        # believe it still holds the lock (and then never acquires it again) or keep a stale node name.
        lock = self._lock = self.tm.client.Lock(self.tm.paths.election(self.job), identifier=self.tm.member)
        self.state = LeaderState.CONTENDING
        try:
            if not lock.acquire(blocking=True, timeout=timeout):
                raise LockTimeout()
        except LockTimeout:
            self._abandon(lock)
            self.state = LeaderState.IDLE
            raise NotLeader(f"job {self.job!r}: not elected within {timeout}s; another replica leads") from None
        except NoAuthError:  # the job's znodes are another job identity's
            self._abandon(lock)
            self.state = LeaderState.IDLE
            raise self.tm.denied(f"contending for job {self.job!r}") from None
        except KazooException as exc:  # kazoo's lock recipe gave up on its own retries
            self._abandon(lock)
            self.state = LeaderState.IDLE
            # A session that can never come back (a rebuilt server) says so rather than "check ZooKeeper".
            raise self.tm.ended_error() or ZooKeeperUnavailable(
                f"job {self.job!r}: could not contend for leadership ({type(exc).__name__}); check that "
                "ZooKeeper is up") from None
        self.tm.add_state_listener(self._on_state_change)
        try:
            return self.tm.retry_races(f"job {self.job!r}: taking its term kept racing with other writers of its "
                                       f"term for {self.tm.operation_timeout:g}s; try again",
                                       lambda: self._take_term(term_floor), counter="leader_election")
        except BaseException:
            self._give_up_lock()
            raise

    @property
    def leading_term(self) -> int:
        """The term this replica won; ``NotLeader`` before it won one."""
        if self.term is None:
            raise NotLeader(f"job {self.job!r}: this replica holds no term; acquire() first")
        return self.term

    def _take_term(self, term_floor: int) -> int:
        p = self.tm.paths
        found = self.tm.read(p.term(self.job), TermRecord)
        if found is None:
            raise JobNotFound(f"job {self.job!r} was unregistered while this replica contended")
        current, stat = found
        new = TermRecord(max(current.term, term_floor) + 1)
        leader = LeaderRecord(member=self.tm.member, term=new.term, host=socket.gethostname(),
                              since_ms=self.tm.server_clock.now_ms())
        ops = [*self._incarnation_check(), *self._contender_check(),
               SetData(p.term(self.job), new.to_json(), stat.version)]
        if self.tm.get(p.leader(self.job)) is not None:
            ops.append(Delete(p.leader(self.job)))  # left by a fenced zombie whose session is still alive
        ops.append(Create(p.leader(self.job), leader.to_json(), ephemeral=True))
        try:
            self.tm.multi(ops)
        except MultiFailed as failed:
            if failed.op.kind == "check" and failed.op in self._contender_check():
                raise NotLeader(f"job {self.job!r}: this replica's election node went with its session before it "
                                "took the term (the session expired); contend again") from None
            if failed.op.kind == "check":  # not elected: acquiring again reads the registration there is now
                raise NotLeader(f"job {self.job!r} was unregistered (and perhaps registered again) while this "
                                "replica contended; contend again") from None
            if isinstance(failed.error, (BadVersionError, NodeExistsError, NoNodeError)):
                raise Raced() from None
            raise
        with self._state_lock:
            self.term, self._term_version = new.term, stat.version + 1
            if self.state == LeaderState.CONTENDING:
                self.state = LeaderState.LEADING
        return new.term

    def _contender_check(self) -> list[Op]:
        """The multi that takes the term requires this replica's contender node (ephemeral: gone with an
        expired session, and then another replica may hold the lock)."""
        lock = self._lock
        if lock is None or lock.node is None:
            raise NotLeader(f"job {self.job!r}: this replica is not contending; acquire() first")
        return [Check(f"{lock.path}/{lock.node}", -1)]

    def _on_state_change(self, state: str) -> None:
        with self._state_lock:
            if state == KazooState.SUSPENDED and self.state == LeaderState.LEADING:
                self.state = LeaderState.SUSPENDED
            elif state == KazooState.CONNECTED and self.state == LeaderState.SUSPENDED:
                self.state = LeaderState.LEADING
            elif state == KazooState.LOST and self.state in (LeaderState.LEADING, LeaderState.SUSPENDED,
                                                              LeaderState.CONTENDING):
                self.state = LeaderState.LOST
            self._state_lock.notify_all()

    # -- fenced writes ------------------------------------------------------------------------

    @property
    def is_leading(self) -> bool:
        """Whether this replica leads right now (``LEADING``), as its state says: no ZooKeeper request."""
        return self.state == LeaderState.LEADING

    def ensure_leading(self) -> None:
        """Raise unless this replica may write right now.

        While the connection is SUSPENDED nothing is written; the caller waits (at most one
        session timeout) to learn whether the session survived (LEADING again) or expired
        (``Fenced``), and gets ``NotLeader`` if it is still unknown by then.
        """
        with self._state_lock:
            self._state_lock.wait_for(lambda: self.state != LeaderState.SUSPENDED,
                                      timeout=self.tm.session_timeout)
        state = self.state
        if state == LeaderState.LEADING:
            return
        if state == LeaderState.SUSPENDED:
            raise NotLeader(f"job {self.job!r}: the ZooKeeper connection is suspended; not committing until "
                            "it is back (the epoch resumes then, or a new leader recovers it)")
        if state == LeaderState.LOST:
            raise Fenced(f"job {self.job!r}: this replica's ZooKeeper session expired, so its leadership "
                         f"(term {self.term}) is over; another replica may lead now. Contend again.")
        if state == LeaderState.FENCED:
            raise self._fenced_error()
        raise NotLeader(f"job {self.job!r}: this replica is {state.value}, not the leader")

    def confirm(self) -> bool:
        """Ask ZooKeeper whether this replica still holds its term: after an error that fencing may explain
        (another leader's commit can make this one's Iceberg write fail before any ``transact`` notices)."""
        if self.state != LeaderState.LEADING:
            return False
        try:
            found = self.tm.get(self.tm.paths.term(self.job))
            registered = self._incarnation is None or self.tm.get(
                self.tm.paths.incarnation(self.job, self._incarnation)) is not None
        except TidemarkError:
            return False
        if found is None or found[1].version != self._term_version or not registered:
            with self._state_lock:
                self.state = LeaderState.FENCED
            return False
        return True

    def _incarnation_check(self) -> list[Op]:
        """A registration made before incarnations existed has none: its term version alone fences it."""
        if self._incarnation is None:
            return []
        return [Check(self.tm.paths.incarnation(self.job, self._incarnation), -1)]

    def fencing_checks(self) -> list[Op]:
        """The checks every write of this leader carries: its term is current, in the registration it won.

        :raises NotLeader: this replica holds no term.
        """
        if self._term_version is None:
            raise NotLeader(f"job {self.job!r}: this replica holds no term; acquire() first")
        return [*self._incarnation_check(), Check(self.tm.paths.term(self.job), self._term_version)]

    def transact(self, ops: Sequence[Op]) -> list[Any]:
        """Apply ``ops`` atomically, only if this replica still holds the job's term.

        :raises NotLeader: this replica does not lead, or the connection stayed SUSPENDED for a session timeout.
        :raises Fenced: the session expired, or the term or the registration moved on (state ``FENCED``).
        :raises MultiFailed: one of ``ops`` failed (the fencing checks passed): nothing was applied.
        """
        self.ensure_leading()
        try:
            return self.tm.multi([*self.fencing_checks(), *ops])
        except MultiFailed as failed:
            if failed.op.kind == "check":
                with self._state_lock:
                    self.state = LeaderState.FENCED
                raise self._fenced_error() from None
            raise

    def _fenced_error(self) -> Fenced:
        if (self._incarnation is not None
                and self.tm.get(self.tm.paths.incarnation(self.job, self._incarnation)) is None):
            return Fenced(f"job {self.job!r}: the registration this replica was elected in (term {self.term}) was "
                          "unregistered; whatever is registered now is another incarnation. Stop writing: this "
                          "driver is a zombie.")
        found = self.tm.read(self.tm.paths.term(self.job), TermRecord)
        now = found[0] if found else None
        by = f"by {now.fenced_by}" if now and now.fenced_by else "by a newer leader"
        return Fenced(f"job {self.job!r}: this replica's term {self.term} was fenced {by}; the term is now "
                      f"{now.term if now else 'gone (job unregistered)'}. Stop writing: this driver is a zombie.")

    # -- stepping down ------------------------------------------------------------------------

    def release(self) -> None:
        """Step down: remove ``/leader`` (if still ours) and leave the election."""
        if self.state in (LeaderState.LEADING, LeaderState.SUSPENDED):
            try:
                self.tm.multi([*self.fencing_checks(), Delete(self.tm.paths.leader(self.job))])
            except Exception:  # noqa: BLE001 - stepping down must not fail; the ephemeral goes with the session
                pass
        self._give_up_lock()
        self.state = LeaderState.RELEASED

    def _give_up_lock(self) -> None:
        self.tm.remove_state_listener(self._on_state_change)
        lock, self._lock = self._lock, None
        if lock is None or not lock.is_acquired or lock.node is None:
            return  # an acquire that failed abandoned its node already
        # Not lock.release(): kazoo waits for its delete with no deadline while the connection is down.
        try:
            self._delete_contender(f"{lock.path}/{lock.node}")
        except TidemarkError:  # ZooKeeper unreachable until the deadline: the next acquire deletes the node
            self._abandon(lock)

    def _delete_contender(self, path: str) -> None:
        try:
            self.tm.multi([Delete(path)])
        except MultiFailed as failed:
            if not isinstance(failed.error, NoNodeError):
                raise

    def _abandon(self, lock: Lock) -> None:
        """Remember ``lock``'s contender node (by its unique prefix) until it is seen deleted: if the session
        survives, a node left behind would be the head of the election queue forever."""
        with _ABANDONED_LOCK:
            _ABANDONED.setdefault(self.tm, set()).add(f"{lock.path}/{lock.prefix}")

    def _sweep_abandoned(self) -> None:
        """Delete this session's abandoned contender nodes of this job that are still there (deadline-bounded:
        ``ZooKeeperUnavailable``); forget those that are gone."""
        election = self.tm.paths.election(self.job)
        with _ABANDONED_LOCK:
            mine = [p for p in _ABANDONED.get(self.tm, ()) if p.rsplit("/", 1)[0] == election]
        if not mine:
            return
        children = self.tm.children(election)
        for prefix in mine:
            for child in (c for c in children if f"{election}/{c}".startswith(prefix)):
                self._delete_contender(f"{election}/{child}")
            with _ABANDONED_LOCK:
                _ABANDONED.get(self.tm, set()).discard(prefix)

    def __enter__(self) -> Leadership:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
