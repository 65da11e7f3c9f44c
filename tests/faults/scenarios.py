"""The fault suite's scenarios: each one runs the cascade and injects one kind of fault, repeatedly.

Every scenario is a function ``(env, run, seed, faults) -> RunResult`` registered in ``SCENARIOS``
with its default number of runs and faults per run. Random choices (which step, which job, how long
to wait before the next fault) come from ``random.Random(seed)``, so a run is reproducible up to the
machine's timing.
"""
from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from coordinator import CatalogSettings, EpochRecord, EpochState, TidemarkError
from coordinator.crashpoints import EPOCH_STEPS
from coordinator.iceberg.catalog import REST_TIMEOUT_PROPERTY
from coordinator.job.supervisor import EXIT_ZOOKEEPER_REBUILT
from coordinator.operations.zookeeper_server import ZooKeeperEnsemble, four_letter_word
from coordinator.records import LeaderRecord, TermRecord
from tests.faults.cascade import COUNTER, JOBS, TOTALS
from tests.faults.harness import (
    GRACE_MS,
    INTERVAL_MS,
    MID_EPOCH,
    RECOVERY_DEADLINE,
    REPO,
    SESSION_TIMEOUT,
    Cascade,
    Environment,
    Fault,
    Replica,
    RunResult,
    newest_epoch_state,
)
from tests.faults.spark import SparkRun
from tests.helpers.cli import tidemark
from tests.helpers.network import Host, TestNetwork
from tests.helpers.rest_proxy import PUBLISH, REAL_ANSWER, CommitOutcomeProxy
from tests.helpers.spark_cluster import SparkCluster
from tests.helpers.wait import wait_for


@dataclass(frozen=True)
class Scenario:
    name: str
    runs: int
    faults: int                      # per run
    run: Callable[[Environment, int, int, int], RunResult]
    what: str


def steps_of(job: str, steps: tuple[str, ...]) -> tuple[str, ...]:
    """The ``steps`` an epoch of ``job`` reaches: ``staged-one`` only with several sinks (``counter``'s two)."""
    return tuple(s for s in steps if s != "staged-one" or job == COUNTER)


def pause(rng: random.Random, low: float = 0.3, high: float = 1.5) -> None:
    """A seeded jitter between faults, so that each one hits the pipeline at a different point of an epoch."""
    threading.Event().wait(rng.uniform(low, high))


def kill_nine(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """Every replica starts with a crash point (each step in turn, in a seeded order; at its first time, or its
    second one time in four): it leads until it kills itself there, the standby takes over, and the supervisor
    starts a new standby with the next one."""
    rng = random.Random(seed)
    steps = {job: itertools.cycle(rng.sample(steps_of(job, EPOCH_STEPS), len(steps_of(job, EPOCH_STEPS))))
             for job in JOBS}
    lock = threading.Lock()

    def plan(job: str) -> str:
        with lock:
            return f"{next(steps[job])}:{1 if rng.random() < 0.75 else 2}"
    with Cascade(env, "kill-9", run, seed, crash_plan=plan) as cascade:
        cascade.start()
        wait_for(lambda: len(cascade.faults) >= faults, f"{faults} crash points to be reached", faults * 20.0,
                   every=0.2)
        cascade.crash_plan = lambda job: None
        return cascade.finish()


def zombie(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """SIGSTOP a job's leader for the session timeout + 2 s: the standby takes over; then SIGCONT the zombie,
    which must find itself fenced, change nothing, and become a standby."""
    def pause_past_session(cascade: Cascade, leader: Replica) -> None:
        stopped_at = time.monotonic()
        fault = cascade.inject("SIGSTOP past the session timeout", leader.job, lambda: leader.signal(signal.SIGSTOP))
        cascade.wait_recovered(fault)
        wait_for(lambda: time.monotonic() - stopped_at > SESSION_TIMEOUT + 2, "the pause to end", 30)
        leader.signal(signal.SIGCONT)
    return _hit_each_leader(env, "zombie", run, seed, faults, pause_past_session)


def zombie_mid_commit(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """SIGSTOP a job's leader as if in the middle of a catalog commit of its first sink (its row updated, not
    committed: ``hold_catalog_row``), and keep it paused until the standby has taken over and committed. The
    standby's first commit, claiming its sinks, waits on that row lock: it must get through (PostgreSQL ends
    the paused session's transaction) and say what it waits for meanwhile; it waited silently until the
    zombie came back (issue 22: a 90 s stall, because the harness resumes a zombie only after recovery)."""
    def pause_mid_commit(cascade: Cascade, leader: Replica) -> None:
        sink = cascade.tables.job(leader.job)[1][0]
        released: list[Callable[[], None]] = []

        def act() -> None:
            leader.signal(signal.SIGSTOP)
            released.append(cascade.hold_catalog_row(sink))
        try:
            cascade.wait_recovered(cascade.inject("SIGSTOP mid-commit (its catalog row lock held)", leader.job, act))
        finally:
            leader.signal(signal.SIGCONT)
            for release in released:
                release()
    return _hit_each_leader(env, "zombie-mid-commit", run, seed, faults, pause_mid_commit)


def takeover_pause(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """SIGSTOP a job's leader past its session; the moment the standby has taken over (the leader znode names
    it), SIGSTOP that one too, in the middle of its takeover, and SIGCONT the first: the old leader, a fenced
    zombie now, must step down, contend again and take over from the paused new leader, which stays paused
    until the job committed again."""
    def pause_both(cascade: Cascade, leader: Replica) -> None:
        stopped_at = time.monotonic()
        taken: list[Replica] = []

        def act() -> None:
            leader.signal(signal.SIGSTOP)
            taken.append(wait_for(lambda: _new_leader(cascade, leader), f"a standby of {leader.job} to take over",
                                  RECOVERY_DEADLINE, every=0.005))
            taken[0].signal(signal.SIGSTOP)
        try:
            fault = cascade.inject("SIGSTOP of the new leader just after it took over", leader.job, act)
            wait_for(lambda: time.monotonic() - stopped_at > SESSION_TIMEOUT + 2, "the pause to end", 30)
            leader.signal(signal.SIGCONT)
            cascade.wait_recovered(fault)
        finally:
            leader.signal(signal.SIGCONT)
            for replica in taken:
                replica.signal(signal.SIGCONT)
    return _hit_each_leader(env, "takeover-pause", run, seed, faults, pause_both)


def _new_leader(cascade: Cascade, old: Replica) -> Optional[Replica]:
    """The live replica of ``old``'s job that the leader znode names, if it is not ``old``."""
    tm = cascade.tm
    try:
        found = tm.get(tm.paths.leader(old.job))  # type: ignore[union-attr]
    except TidemarkError:
        return None
    member = LeaderRecord.from_json(found[0]).member if found is not None else None
    return next((r for r in cascade.slots.values() if r.member == member and r is not old and r.proc.poll() is None),
                None)


def session_expiry(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """Expire a job leader's ZooKeeper session on the server (a second client attaches to the session and
    closes it); the leader must step down, and the job must go on under a new term."""
    def expire(cascade: Cascade, leader: Replica) -> None:
        cascade.wait_recovered(cascade.inject("ZooKeeper session expired", leader.job,
                                              lambda: cascade.expire_session(leader)))
    return _hit_each_leader(env, "session-expiry", run, seed, faults, expire)


def _hit_each_leader(env: Environment, scenario: str, run: int, seed: int, faults: int,
                     hit: Callable[[Cascade, Replica], None], **options: Any) -> RunResult:
    """``hit`` the leader of each job in turn, ``faults`` times, a seeded moment after finding it (``options``: the
    cascade's)."""
    rng = random.Random(seed)
    with Cascade(env, scenario, run, seed, **options) as cascade:
        cascade.start()
        for i in range(faults):
            leader = cascade.leader_replica(JOBS[i % len(JOBS)])
            pause(rng)
            hit(cascade, leader)
        return cascade.finish()


def zookeeper_partition(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """On the lakehouse, with every replica in a network namespace of its own: cut a job's leader off from ZooKeeper,
    and from ZooKeeper only (it still reaches S3 and the REST catalog, and keeps running), in turn while it stages
    an epoch (STARTED) and the moment its epoch's first sink publish (a move of ``main``) has landed in the catalog
    (a proxy in front of the catalog cuts it then, answering as the catalog did); heal once its session has expired
    and a standby has taken over and committed. Unlike a paused zombie it goes on meanwhile: it finishes staging,
    or publishes the epoch's other sinks while the standby rolls the same epoch forward; whatever it publishes after
    its term was taken must be refused (the term fences its sinks in Iceberg), and every sink's history must stay
    in term order. Once healed it must say in one line that it lost its leadership, and contend again."""
    lakehouse = env.lakehouse()
    hits = itertools.count()  # staging and publishing in turn, and each for each job in turn: (counter, staging),
    # (totals, publishing), (counter, publishing), (totals, staging), ...
    with TestNetwork(f"zk-partition-{run}") as network, CommitOutcomeProxy(lakehouse.catalog_uri) as proxy:
        def cut_off(cascade: Cascade, leader: Replica) -> None:
            hit = next(hits)
            host, said_from = leader.host, leader.log_size()
            step = ("staging", "publishing")[(hit + hit // len(JOBS)) % 2]
            assert host is not None
            kind = f"leader cut off from ZooKeeper (not the lakehouse) while {step}"

            def cut() -> None:
                network.cut(host, network.ZOOKEEPER)
            if step == "staging":
                wait_for(lambda: newest_epoch_state(cascade.tm, leader.job) == EpochState.STARTED,  # type: ignore[arg-type]
                         f"{leader.job} to be staging", RECOVERY_DEADLINE, every=0.005)
                fault = cascade.inject(kind, leader.job, cut)
            else:
                first_sink = cascade.tables.job(leader.job)[1][0].rsplit(".", 1)[1]
                fault = _inject_when_committed(cascade, proxy, kind, leader.job, cut, first_sink, PUBLISH)
            cut_at = time.monotonic()
            try:
                cascade.wait_recovered(fault)
                wait_for(lambda: time.monotonic() - cut_at > SESSION_TIMEOUT + 2, "the cut to outlast the session",
                         30)
            finally:
                network.heal(host, network.ZOOKEEPER)
            wait_for(lambda: _said_leadership_lost(leader, said_from), f"{leader.member}, healed, to say it lost "
                     "its leadership", RECOVERY_DEADLINE)
        settings = CatalogSettings(name=lakehouse.catalog_name,
                                   python_properties={**lakehouse.python_properties(), "uri": proxy.uri})
        return _hit_each_leader(env, "zk-partition", run, seed, faults, cut_off, settings=settings, network=network)


CATALOG_DEADLINE_S = 6   # catalog-partition's REST request deadline: its cuts last from half of it to twice it


def catalog_partition(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """On the lakehouse, with every replica in a network namespace of its own: the moment a sink's commit has
    reached the REST catalog and landed, cut that job's replicas off from the lakehouse (the catalog and S3), with
    ZooKeeper still reachable, so the catalog's answer is in flight over the cut; heal after a seeded 3 to 12 s.
    The leader keeps its session throughout. A cut shorter than the catalog's request deadline (6 s here) ends
    with the answer arriving once healed (TCP retransmits it); a longer one with the request timing out, an
    unknown outcome: the leader steps down, and whoever leads next reads the sink back before publishing. Either
    way no epoch may be lost, repeated or half-published."""
    rng = random.Random(seed)
    lakehouse = env.lakehouse()
    with TestNetwork(f"catalog-partition-{run}") as network, CommitOutcomeProxy(lakehouse.catalog_uri) as proxy:
        settings = CatalogSettings(name=lakehouse.catalog_name,
                                   python_properties={**lakehouse.python_properties(), "uri": proxy.uri,
                                                      REST_TIMEOUT_PROPERTY: str(CATALOG_DEADLINE_S)})
        with Cascade(env, "catalog-partition", run, seed, settings=settings, network=network) as cascade:
            cascade.start()
            for _ in range(faults):
                pause(rng)
                job = rng.choice(JOBS)
                sink = rng.choice(cascade.tables.job(job)[1]).rsplit(".", 1)[1]
                hosts = [r.host for r in cascade.slots.values() if r.job == job and r.host is not None]

                def cut_all() -> None:
                    for host in hosts:
                        network.cut(host, network.LAKEHOUSE)
                fault = _inject_when_committed(cascade, proxy, f"{job}'s drivers cut off from the lakehouse "
                                               f"mid-commit of {sink}", job, cut_all, sink)
                pause(rng, CATALOG_DEADLINE_S / 2, CATALOG_DEADLINE_S * 2)
                for host in hosts:
                    network.heal(host, network.LAKEHOUSE)
                cascade.wait_recovered(fault)
            return cascade.finish()


def _inject_when_committed(cascade: Cascade, proxy: CommitOutcomeProxy, kind: str, job: str, act: Callable[[], None],
                           table: str, containing: bytes = b"") -> Fault:
    """Inject fault ``kind`` with ``act`` the moment the next commit of ``table`` (whose request contains
    ``containing``) has landed in the catalog behind ``proxy``, before its answer goes back; returns the fault."""
    injected: list[Fault] = []
    proxy.fail_commits(every=1, status=REAL_ANSWER, times=1, matching=f"/tables/{table}", containing=containing,
                       then=lambda: injected.append(cascade.inject(kind, job, act)))
    return wait_for(lambda: injected, f"a commit of {table}", RECOVERY_DEADLINE, every=0.01)[0]


def _said_leadership_lost(replica: Replica, offset: int) -> bool:
    """Whether ``replica`` said since ``offset`` in its log that it lost its leadership (or it has exited)."""
    return replica.proc.poll() is not None or any(f"job {replica.job}: leadership lost" in line
                                                   for line in replica.log_lines_since(offset))


def clock_skew(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """Every replica under a wall clock of its own (``tests/helpers/skewclock.c`` preloaded; its monotonic clock
    stays right): a job's leader's clock moved, in turn, 30 s ahead, 30 s behind, and 10 s back from where it
    was (an NTP step), each left so until the next fault of that replica. Drivers pace on ZooKeeper's clock: the
    root job must take no barrier before ZooKeeper's clock passed it by the grace (each epoch's commit time is the
    stamp the server put on its record), the derived job only barriers its source committed, and neither may
    stall; nothing lost, repeated or misread."""
    rng = random.Random(seed)
    moves = itertools.cycle([("30 s ahead", lambda now: 30_000), ("30 s behind", lambda now: -30_000),
                             ("stepped back 10 s", lambda now: now - 10_000)])
    offsets: dict[tuple[str, int], int] = {}
    with Cascade(env, "clock-skew", run, seed, skewed_clocks=True) as cascade:
        cascade.start()
        for i in range(faults):
            leader = cascade.leader_replica(JOBS[i % len(JOBS)])
            pause(rng)
            kind, move = next(moves)
            slot = (leader.job, leader.slot)
            offsets[slot] = move(offsets.get(slot, 0))
            cascade.wait_recovered(cascade.inject(f"a leader's wall clock {kind}", leader.job,
                                                  lambda: cascade.clock(*slot).set(offsets[slot])))
        result = cascade.finish()
        result.problems += _taken_before_zookeepers_clock(cascade, COUNTER)
        upstream = set(cascade.epochs_of(COUNTER))
        result.problems += [f"totals committed epoch {epoch}, which counter never committed"
                            for epoch in cascade.epochs_of(TOTALS) if epoch not in upstream]
        return result


def _taken_before_zookeepers_clock(cascade: Cascade, job: str) -> list[str]:
    """The epochs of root job ``job`` committed before ZooKeeper's clock passed them by the grace: their record's
    ``mtime``, the server's stamp, earlier than the epoch plus the grace (less 50 ms: the stamp is in ms)."""
    tm = cascade.tm
    path = tm.paths.epochs(job)  # type: ignore[union-attr]
    early = []
    for child in (c for c in tm.children(path) if c.isdigit()):  # type: ignore[union-attr]
        found = tm.get(f"{path}/{child}")  # type: ignore[union-attr]
        if found is None:
            continue
        record = EpochRecord.from_json(found[0])
        if record.state == EpochState.COMMITTED and found[1].mtime < record.epoch + GRACE_MS - 50:
            early.append(f"{job}'s epoch {record.epoch} committed at {found[1].mtime} on ZooKeeper's clock, "
                         f"before its barrier plus the grace")
    return early


def zookeeper_restart(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """kill -9 the ZooKeeper server and start it again on its data: sessions survive, no epoch is lost."""
    rng = random.Random(seed)

    def restart() -> None:
        env.zookeeper.kill()
        env.zookeeper.start()
    with Cascade(env, "zk-restart", run, seed) as cascade:
        cascade.start()
        for _ in range(faults):
            pause(rng)
            cascade.wait_recovered(cascade.inject("ZooKeeper server restarted", None, restart))
        return cascade.finish()


def zookeeper_ensemble(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """A three-server ensemble on loopback loses a follower (kill -9), which then rejoins; then it loses its
    leader, which then rejoins; repeated. Sessions move to the surviving servers."""
    rng = random.Random(seed)
    with ZooKeeperEnsemble(env.run_dir("zk-ensemble", run) / "ensemble") as ensemble, \
            Cascade(env, "zk-ensemble", run, seed, hosts=ensemble.connect_string) as cascade:
        cascade.start()
        for i in range(faults):
            pause(rng)
            if i % 2 == 0:
                member, kind = rng.choice(ensemble.followers()), "ensemble lost a follower"
            else:
                member = wait_for(_leader_of(ensemble), "the ensemble to elect a leader", 60)
                kind = "ensemble lost its leader"
            cascade.wait_recovered(cascade.inject(kind, None, member.kill))
            member.start()
        return cascade.finish()


def zookeeper_split(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """A three-server ensemble, each server in a network namespace of its own and every replica in one of its own:
    split it 1 | 2, the one being the server a job's leader has its session on (the drivers still reach every
    server). The majority goes on; the lone server, until it notices it lost its quorum (the sync limit, 2 s),
    serves reads that may be stale, then drops its clients, whose sessions move to the majority if they get there
    within their timeout, else expire (a standby takes over). Healed after a seeded 8 to 12 s, the server
    rejoins."""
    rng = random.Random(seed)
    with TestNetwork(f"zk-split-{run}") as network:
        servers = [network.host(f"zookeeper-{i}") for i in range(1, 4)]
        placement = [(h.address, h.command) for h in servers]
        with ZooKeeperEnsemble(env.run_dir("zk-split", run) / "ensemble", placement=placement) \
                as ensemble, Cascade(env, "zk-split", run, seed, hosts=ensemble.connect_string,
                                     network=network) as cascade:
            cascade.start()
            for i in range(faults):
                leader = cascade.leader_replica(JOBS[i % len(JOBS)])
                pause(rng)
                alone = wait_for(lambda: _server_of(ensemble, servers, leader), f"{leader.member}'s server", 30)
                others = [h for h in servers if h is not alone]
                links = [(alone, o) for o in others] + [(o, alone) for o in others]
                split_at, lasting = time.monotonic(), rng.uniform(8, 12)

                def split() -> None:
                    for host, peer in links:
                        network.cut(host, peer.address)
                fault = cascade.inject(f"ensemble split 1 | 2, {leader.job}'s leader on the one", None, split)
                try:
                    wait_for(lambda: time.monotonic() - split_at > lasting, "the split to last", 30)
                finally:
                    for host, peer in links:
                        network.heal(host, peer.address)
                cascade.wait_recovered(fault)
                member = ensemble.members[servers.index(alone)]
                wait_for(lambda: member.mode() in ("leader", "follower"), "the lone server to rejoin", 60)
            return cascade.finish()


def _server_of(ensemble: ZooKeeperEnsemble, servers: list[Host], replica: Replica) -> Optional[Host]:
    """The host of the ensemble's server ``replica`` has its session on now (its address in the server's ``stat``)."""
    address = f"/{replica.host.address}:" if replica.host is not None else None
    for member, host in zip(ensemble.members, servers):
        stat = (four_letter_word(member.host, member.port, b"stat") or b"").decode(errors="replace")
        if address and address in stat:
            return host
    return None


def _leader_of(ensemble: ZooKeeperEnsemble):
    def find():
        try:
            return ensemble.leader()
        except TidemarkError:
            return None
    return find


def catalog_restart(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """Restart the PostgreSQL catalog database (immediate shutdown: a crash, then WAL recovery) while the
    counter job is in the middle of an epoch (STARTED or PRECOMMITTED)."""
    rng = random.Random(seed)
    with Cascade(env, "catalog-restart", run, seed) as cascade:
        cascade.start()
        for _ in range(faults):
            pause(rng)
            wait_for(lambda: _mid_epoch(cascade), "the counter job to be mid-epoch", RECOVERY_DEADLINE, every=0.01)
            cascade.wait_recovered(cascade.inject("catalog database restarted mid-epoch", None,
                                                  lambda: env.postgres.restart("immediate")))
        return cascade.finish()


def serve_kill(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """kill -9 of `tidemark serve` while a reader that knows nothing of Tidemark (pyiceberg's RestCatalog) reads
    through it, then a restart on the same port after a seeded pause: the reader's next reads are consistent and
    never older than the ones before."""
    rng = random.Random(seed)
    with Cascade(env, "serve-kill", run, seed) as cascade:
        cascade.start()
        served = cascade.dashboards[0]
        for _ in range(faults):
            pause(rng)
            served.reading.wait(RECOVERY_DEADLINE)
            reads = served.reads
            fault = cascade.inject("tidemark serve killed -9 mid-read", None, cascade.endpoint.kill)
            pause(rng, 0.2, 1.0)
            cascade.endpoint.start()
            wait_for(lambda: served.reads > reads + 1, "two reads through the restarted endpoint", RECOVERY_DEADLINE,
                     every=0.1)
            cascade.wait_recovered(fault)
        return cascade.finish()


def object_store_kill(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """On the lakehouse (S3 and the REST catalog: one server), kill -9 it while the counter job stages an epoch
    (STARTED: data files and the staged snapshot going to S3) and while it publishes one (PRECOMMITTED), in turn;
    restart it on the same data after a seeded pause."""
    rng = random.Random(seed)
    lakehouse = env.lakehouse()
    steps = itertools.cycle([(EpochState.STARTED, "staging"), (EpochState.PRECOMMITTED, "publishing")])
    with Cascade(env, "object-store-kill", run, seed, settings=lakehouse.catalog_settings()) as cascade:
        cascade.start()
        for state, step in itertools.islice(steps, faults):
            pause(rng)
            wait_for(lambda: newest_epoch_state(cascade.tm, COUNTER) == state,  # type: ignore[arg-type]
                     f"the counter job to be {step}", RECOVERY_DEADLINE, every=0.005)

            def kill_and_restart() -> None:
                lakehouse.kill()
                pause(rng, 1.0, 3.0)
                lakehouse.start()
            cascade.wait_recovered(cascade.inject(f"object store killed -9 while {step}", None, kill_and_restart))
        return cascade.finish()


def rest_commit_kill(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """The REST catalog killed -9 in the middle of a table commit of a job's sink: the commit has landed, the
    writer never hears so and finds the catalog gone (a proxy in front of the catalog kills it before answering);
    restarted after a seeded pause, the writer must learn the outcome by reading the table back."""
    rng = random.Random(seed)
    lakehouse = env.lakehouse()
    with CommitOutcomeProxy(lakehouse.catalog_uri) as proxy:
        settings = CatalogSettings(name=lakehouse.catalog_name,
                                   python_properties={**lakehouse.python_properties(), "uri": proxy.uri})
        with Cascade(env, "rest-commit-kill", run, seed, settings=settings) as cascade:
            cascade.start()
            for _ in range(faults):
                pause(rng)
                sink = rng.choice([cascade.tables.ids, cascade.tables.counts, cascade.tables.totals])

                def kill_mid_commit() -> None:
                    proxy.fail_commits(every=1, status=None, times=1, matching=f"/tables/{sink.rsplit('.', 1)[1]}",
                                       then=lakehouse.kill)
                    wait_for(lambda: proxy.failed, f"a commit of {sink}", RECOVERY_DEADLINE, every=0.01)
                    pause(rng, 1.0, 3.0)
                    lakehouse.start()
                cascade.wait_recovered(cascade.inject(f"REST catalog killed -9 mid-commit of {sink.rsplit('.', 1)[1]}",
                                                      None, kill_mid_commit))
            return cascade.finish()


def slow_object_store(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """SIGSTOP of the lakehouse (S3 and the REST catalog) for 15 to 25 s, past every client's request timeout and
    the drivers' ZooKeeper session timeout; then SIGCONT. Requests in flight hang, time out or fail; nothing
    may be lost or made twice."""
    rng = random.Random(seed)
    lakehouse = env.lakehouse()
    with Cascade(env, "slow-object-store", run, seed, settings=lakehouse.catalog_settings()) as cascade:
        cascade.start()
        for _ in range(faults):
            pause(rng)
            wait_for(lambda: _mid_epoch(cascade), "the counter job to be mid-epoch", RECOVERY_DEADLINE, every=0.01)

            def stop_and_continue() -> None:
                pid = lakehouse.running_pid()
                assert pid is not None, "the lakehouse is not running"
                os.killpg(pid, signal.SIGSTOP)
                try:
                    pause(rng, 15.0, 25.0)
                finally:
                    os.killpg(pid, signal.SIGCONT)
            cascade.wait_recovered(cascade.inject("object store stopped (SIGSTOP) 15-25 s", None, stop_and_continue))
        return cascade.finish()


def _mid_epoch(cascade: Cascade) -> bool:
    state = newest_epoch_state(cascade.tm, COUNTER)  # type: ignore[arg-type]
    return state is not None and state in MID_EPOCH


def zookeeper_wipe(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """Delete the whole ZooKeeper tree of the running cascade, then restart every driver and the `tidemark serve`
    process: each job must resume from its sinks' Iceberg metadata, re-reading nothing already in them and skipping
    nothing, and no read, through the endpoint started after the loss too, may step back."""
    rng = random.Random(seed)

    def wipe_and_restart(cascade: Cascade) -> None:
        cascade.wipe_zookeeper()
        cascade.endpoint.kill()
        cascade.restart_every_driver()
        cascade.endpoint.start()
    with Cascade(env, "zk-wipe", run, seed) as cascade:
        cascade.start()
        for _ in range(faults):
            pause(rng, 1.0, 3.0)
            cascade.wait_recovered(cascade.inject("whole ZooKeeper state wiped", None,
                                                  lambda: wipe_and_restart(cascade)))
        return cascade.finish()


def zookeeper_rebuilt(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """Stop the ZooKeeper server, delete its data and start it again empty on the same address, with every driver
    left running (``Cascade.rebuild_zookeeper``). The server refuses their sessions for good; each driver must find
    its server behind its session, say so in one line and start over in its process on a new session: register its
    job again and resume from Iceberg (an exit with ``EXIT_ZOOKEEPER_REBUILT`` for the supervisor to restart it is
    the way out only where it cannot, and is a problem here). Goal: every job commits again within 2 session
    timeouts plus one interval of the fault, with nothing lost or duplicated, and no person acting."""
    rng = random.Random(seed)
    goal_s = 2 * SESSION_TIMEOUT + INTERVAL_MS / 1000
    with Cascade(env, "zk-rebuilt", run, seed, expected_exits=frozenset({EXIT_ZOOKEEPER_REBUILT})) as cascade:
        cascade.start()
        for _ in range(faults):
            pause(rng, 1.0, 3.0)
            cascade.wait_recovered(cascade.inject("ZooKeeper server rebuilt empty", None, cascade.rebuild_zookeeper))
        started_over = sum(line.count("started over in this process") for replica in cascade.slots.values()
                           for line in replica.log_lines_since(0))
        result = cascade.finish()
    result.problems += [f"{f.kind}: recovered in {f.recovery_s:.1f} s, above the goal of {goal_s:.0f} s"
                        for f in result.faults if f.recovery_s is not None and f.recovery_s > goal_s]
    result.problems += [f"a driver exited instead of starting over: {exit_}" for exit_ in cascade.restarted]
    if started_over < faults * len(JOBS):
        result.problems.append(f"{started_over} drivers started over in their process for {faults} rebuilds of "
                               f"{len(JOBS)} jobs: the rebuilt server was not noticed")
    return result


def fence_unregister(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """The operator sequence ``tidemark fence counter``, ``tidemark unregister counter --yes`` against a paused
    leader (a zombie: a GC pause or a partition) and a paused standby, so that nobody takes over in between;
    then the standby resumes and registers the job again, and only after it led does the old leader resume.
    The fenced leader must commit nothing after the fence, and nothing may be counted twice."""
    rng = random.Random(seed)
    with Cascade(env, "fence-unregister", run, seed) as cascade:
        cascade.start()
        violations: list[str] = []
        for _ in range(faults):
            leader = cascade.leader_replica(COUNTER)
            standby = next(r for r in cascade.slots.values()
                           if r.job == COUNTER and r is not leader and r.proc.poll() is None)
            pause(rng)
            fenced: list[tuple[int, int]] = []

            def act() -> None:
                leader.signal(signal.SIGSTOP)
                standby.signal(signal.SIGSTOP)
                try:
                    committed_before = _last_committed(cascade)
                    fenced.append((_fence_and_unregister(cascade), committed_before))
                finally:
                    standby.signal(signal.SIGCONT)
            fault = cascade.inject("fence, unregister --yes, re-register", COUNTER, act)
            try:
                cascade.wait_recovered(fault)
            finally:
                leader.signal(signal.SIGCONT)
            fenced_term, committed_before = fenced[0]
            violations += _committed_by_fenced_terms(cascade, fenced_term, committed_before)
        result = cascade.finish()
        result.problems += violations
        return result


def _last_committed(cascade: Cascade) -> int:
    """The counter job's newest committed epoch (0 before its first)."""
    return max(cascade.epochs_of(COUNTER), default=0)


def _fence_and_unregister(cascade: Cascade) -> int:
    """Run the CLI as an operator would, with the catalog settings (``unregister`` fences the sinks in Iceberg
    and refuses without them); returns the term the fence set."""
    settings = cascade.settings
    env = {**os.environ, "TIDEMARK_CATALOG_NAME": settings.name, "TIDEMARK_CATALOG_URI": settings.uri or "",
           "TIDEMARK_WAREHOUSE": settings.warehouse or ""}

    def cli(*args: str) -> str:
        done = tidemark("--zk", cascade.connect, *args, cwd=str(REPO), env=env)
        if done.returncode != 0:
            raise RuntimeError(f"tidemark {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout
    term = int(cli("fence", COUNTER, "--yes").split("term is now ")[1].split(";")[0])
    cli("unregister", COUNTER, "--yes")
    return term


def _committed_by_fenced_terms(cascade: Cascade, fenced_term: int, committed_before: int) -> list[str]:
    """Epochs above the last one committed before the fence, committed under a term at or below the fenced one:
    a fenced leader that committed, or a term reused after re-registration (a job's term must never go backwards
    nor be reused). The re-registered job's first record repeats its resume point, with the term that wrote it."""
    tm = cascade.tm
    path = tm.paths.epochs(COUNTER)  # type: ignore[union-attr]
    term = tm.read(tm.paths.term(COUNTER), TermRecord)  # type: ignore[union-attr]
    found = []
    for child in (c for c in tm.children(path) if c.isdigit()):  # type: ignore[union-attr]
        read = tm.read(f"{path}/{child}", EpochRecord)  # type: ignore[union-attr]
        if read is not None and read[0].epoch > committed_before and read[0].term <= fenced_term:
            found.append(f"epoch {read[0].epoch} committed after the fence under term {read[0].term}, not above the "
                         f"fenced term {fenced_term} (a fenced leader committed, or a term was reused; the term is "
                         f"now {term[0].term if term else '?'})")
    return found


# The steps of a computed epoch (an idle one reaches ``idle-commit`` instead).
COMPUTED_STEPS = tuple(s for s in EPOCH_STEPS if s != "idle-commit")


def coalesced_kill(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """Take every replica of ``totals`` down (kill -9) for a seeded 3 to 6 intervals while ``counter`` goes on,
    then start them again with a crash point in their first epoch: that one epoch covers every barrier of the
    downtime (coalescing), it is killed at a seeded step, and the next leader rolls it forward or recomputes
    it. Nothing may be lost, duplicated or misread, and the catch-up must be one epoch."""
    rng = random.Random(seed)
    with Cascade(env, "coalesced-kill", run, seed) as cascade:
        cascade.start()
        for _ in range(faults):
            pause(rng)
            step = rng.choice(steps_of(TOTALS, COMPUTED_STEPS))
            down_s = rng.uniform(3, 6) * INTERVAL_MS / 1000
            holder: dict[str, int] = {}
            fault = cascade.inject(f"{down_s:.0f} s down, then kill -9 at {step} of the coalesced epoch", TOTALS,
                                   lambda: holder.update(before=cascade.take_down(TOTALS, down_s, f"{step}:1")))
            cascade.wait_recovered(fault)
            cascade.crash_plan = lambda job: None
            caught_up = [e for e in cascade.epochs_of(TOTALS) if e > holder["before"]]
            if caught_up and caught_up[0] - holder["before"] < 2 * INTERVAL_MS:
                raise AssertionError(f"totals' first epoch after {down_s:.1f} s down, {caught_up[0]}, does not "
                                     f"cover the barriers since {holder['before']}: it did not coalesce")
        return cascade.finish()


def mixed_cadence(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """``totals`` as a batch job at 4 times ``counter``'s cadence, killed at each step of its epochs in turn;
    every consistent read across the 1 s and the 4 s tables is checked, and totals' epochs must all be on
    its cadence."""
    rng = random.Random(seed)
    every = 4 * INTERVAL_MS
    steps = itertools.cycle(rng.sample(steps_of(TOTALS, COMPUTED_STEPS), len(steps_of(TOTALS, COMPUTED_STEPS))))
    lock = threading.Lock()

    def plan(job: str) -> Optional[str]:
        with lock:
            return f"{next(steps)}:1" if job == TOTALS else None
    with Cascade(env, "mixed-cadence", run, seed, crash_plan=plan, every={TOTALS: every}) as cascade:
        cascade.start()
        wait_for(lambda: len(cascade.faults) >= faults, f"{faults} crash points to be reached", faults * 30.0,
                 every=0.2)
        cascade.crash_plan = lambda job: None
        result = cascade.finish()
        off = [e for e in cascade.epochs_of(TOTALS) if e % every]
    if off:
        result.problems.append(f"totals committed epochs off its {every} ms cadence: {off[:5]}")
    return result


def spark_cluster(env: Environment, run: int, seed: int, faults: int) -> RunResult:
    """The word-count job on a Spark standalone cluster (``tests/faults/spark.py``): kill -9 of one of the leader's
    executors while it runs a task of an epoch (Spark runs the task again), and of the leading driver with its
    JVM while its epoch is STARTED or PRECOMMITTED (the standby takes over), in a seeded order, half each."""
    rng = random.Random(seed)
    kinds = ([SparkRun.kill_executor, SparkRun.kill_driver] * faults)[:faults]
    rng.shuffle(kinds)
    daemons = env.base / f"spark-cluster-{run}" / "cluster"   # the master's and workers' logs, executors' dirs
    daemons.mkdir(parents=True, exist_ok=True)
    with SparkCluster(daemons, workers=2) as cluster, SparkRun(env, cluster, run, seed) as spark:
        spark.start()
        for kill in kinds:
            pause(rng, 1.0, 3.0)
            kill(spark, rng)
        return spark.finish()


SCENARIOS = {s.name: s for s in [
    Scenario("kill-9", 2, 65, kill_nine, "kill -9 of a driver at every protocol step (crash points)"),
    Scenario("zombie", 3, 6, zombie, "SIGSTOP of a leader past its session timeout, then SIGCONT"),
    Scenario("zombie-mid-commit", 2, 2, zombie_mid_commit, "SIGSTOP of a leader in the middle of a catalog commit "
                                                           "(its row lock held) until the standby committed"),
    Scenario("takeover-pause", 2, 4, takeover_pause, "SIGSTOP of the new leader just after it took over; the old "
                                                     "one, a zombie, must take over from it"),
    Scenario("session-expiry", 2, 15, session_expiry, "a leader's ZooKeeper session expired on the server"),
    Scenario("zk-restart", 2, 6, zookeeper_restart, "the ZooKeeper server killed and restarted"),
    Scenario("zk-ensemble", 2, 4, zookeeper_ensemble, "a 3-server ensemble losing a follower, then its leader"),
    Scenario("catalog-restart", 2, 5, catalog_restart, "the PostgreSQL catalog restarted mid-epoch"),
    Scenario("serve-kill", 2, 4, serve_kill, "tidemark serve killed -9 while a reader reads through it, then "
                                             "restarted"),
    Scenario("zk-wipe", 2, 3, zookeeper_wipe, "the whole ZooKeeper state wiped, every driver restarted"),
    Scenario("zk-rebuilt", 2, 3, zookeeper_rebuilt, "the ZooKeeper server's data deleted, started again empty on the "
                                                    "same address, drivers left running (and restarted on exit)"),
    Scenario("fence-unregister", 2, 3, fence_unregister, "tidemark fence, unregister --yes, re-register"),
    Scenario("coalesced-kill", 2, 4, coalesced_kill, "a job down for several intervals, then kill -9 in its "
                                                      "coalesced catch-up epoch"),
    Scenario("mixed-cadence", 2, 5, mixed_cadence, "a 4 s batch job over a 1 s job, killed at each step; reads "
                                                   "across cadences checked"),
    Scenario("object-store-kill", 2, 4, object_store_kill, "the lakehouse's S3 store and REST catalog killed -9 "
                                                           "while a job stages, and while it publishes"),
    Scenario("rest-commit-kill", 2, 3, rest_commit_kill, "the REST catalog killed -9 after a sink's commit "
                                                         "landed, before the writer heard"),
    Scenario("slow-object-store", 2, 2, slow_object_store, "the lakehouse stopped (SIGSTOP) 15-25 s mid-epoch, "
                                                           "past the clients' timeouts"),
    Scenario("clock-skew", 2, 6, clock_skew, "a leader's wall clock 30 s ahead, 30 s behind, stepped back 10 s "
                                             "(a preloaded library): pacing on ZooKeeper's clock"),
    Scenario("zk-partition", 2, 4, zookeeper_partition, "a leader cut off from ZooKeeper, not the lakehouse, past "
                                                        "its session (network namespaces), then healed"),
    Scenario("zk-split", 2, 4, zookeeper_split, "a 3-server ensemble split 1 | 2 (network namespaces), a job's "
                                                "leader on the one, healed 8-12 s later"),
    Scenario("catalog-partition", 2, 3, catalog_partition, "a job's drivers cut off from the lakehouse mid-commit, "
                                                           "ZooKeeper reachable, healed 3-12 s later"),
    Scenario("spark-cluster", 1, 4, spark_cluster, "kill -9 of an executor, and of the leading driver, mid-epoch on "
                                                   "a Spark standalone cluster"),
]}


def run_scenario(env: Environment, name: str, run: int, seed: int, faults: int) -> RunResult:
    """One run of a scenario; a run that breaks off (a fault never recovered, a command failed) is a failed
    run that says why, and the suite goes on."""
    env.cascade = None
    try:
        return SCENARIOS[name].run(env, run, seed, faults)
    except Exception as exc:  # noqa: BLE001 - reported in the run's line and the table
        problem = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        if env.cascade is None:
            return RunResult(name, seed, [], 0, 0, 0, 0, 0, [], problems=[problem])
        return env.cascade.broken_off(problem)
