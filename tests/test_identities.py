"""Per-job identities and a ZooKeeper that refuses anonymous clients, on real ZooKeeper servers: the server itself
refuses one job's identity everything that changes another job, and closes the session of a client with no identity.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, SessionClosedRequireSaslError
from kazoo.security import make_digest_acl

from coordinator import (
    ConfigurationError,
    EpochCoordinator,
    EpochInputs,
    EpochRecord,
    EpochWriter,
    Fenced,
    PermissionDenied,
    SourceRange,
    Tidemark,
)
from coordinator.history.resolve import Resolver
from coordinator.operations.zookeeper_server import free_port
from coordinator.records import TableTidemark
from coordinator.zookeeper.ops import Create, Delete, SetData
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.lake import create_table
from tests.helpers.present import present
from tests.helpers.wait import wait_for
from tests.test_writer_flow import Runner, as_set, rows

WRITER = ("etl", "s3cret")
OPERATOR = ("ops", "0ps-only")
TEAM_A = ("team-a", "a-pass")
TEAM_B = ("team-b", "b-pass")
CRED_VARS = ("TIDEMARK_ZK_USER", "TIDEMARK_ZK_PASSWORD", "TIDEMARK_ZK_READER_USER", "TIDEMARK_ZK_READER_PASSWORD",
             "TIDEMARK_ZK_JOB_USER", "TIDEMARK_ZK_JOB_PASSWORD", "TIDEMARK_ZK_OPERATOR_USER",
             "TIDEMARK_ZK_OPERATOR_PASSWORD")


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch):
    for name in CRED_VARS:
        monkeypatch.delenv(name, raising=False)


def as_job(monkeypatch, job: tuple[str, str]) -> None:
    """The environment of a driver with its own identity."""
    for name, value in (("TIDEMARK_ZK_USER", WRITER[0]), ("TIDEMARK_ZK_PASSWORD", WRITER[1]),
                        ("TIDEMARK_ZK_JOB_USER", job[0]), ("TIDEMARK_ZK_JOB_PASSWORD", job[1]),
                        ("TIDEMARK_ZK_OPERATOR_USER", OPERATOR[0])):
        monkeypatch.setenv(name, value)


def state_of(tm: Tidemark, job: str, sink: str) -> dict:
    """Every znode of ``job`` and its sink, data and version: what another job must not change."""
    p = tm.paths
    paths = [p.job(job), p.term(job), p.leader(job), p.table(sink), p.tidemark(sink),
             *(f"{p.epochs(job)}/{e}" for e in tm.children(p.epochs(job))),
             *(f"{p.election(job)}/{c}" for c in tm.children(p.election(job)))]
    return {path: (found[0], found[1].version) if (found := tm.get(path)) else None for path in paths}


def run_epoch(epochs: EpochCoordinator, t: int, source: str, sink: str) -> None:
    epochs.begin(t, EpochInputs({source: SourceRange(None, t)}))
    epochs.precommit(t, {sink: t})
    epochs.commit(t, {sink: t})


def test_a_job_identity_cannot_fence_unregister_lead_or_commit_for_another_job(connect, catalog_settings, monkeypatch,
                                                                              capsys, zk_connect):
    operator = connect(auth=WRITER, operator=OPERATOR)  # `tidemark init`: the layout names the operator
    team_a = connect(auth=WRITER, job=TEAM_A, operator=OPERATOR[0])
    team_b = connect(auth=WRITER, job=TEAM_B, operator=OPERATOR[0])
    team_a.register_job("a", sources=["raw.in"], sinks=["lake.db.a"])
    team_b.register_job("b", sources=["lake.db.a"], sinks=["lake.db.b"])
    team_b.barriers.ensure_grid(1000)
    leadership = team_b.leadership("b")
    leadership.acquire()
    epochs = EpochCoordinator(leadership, ["lake.db.b"])
    run_epoch(epochs, 1000, "lake.db.a", "lake.db.b")

    # b's znodes are b's and the operator's; the writer identity every job holds only reads them.
    acl = {entry.id.id.split(":")[0]: entry.perms for entry in team_b.client.get_acls(team_b.paths.term("b"))[0]}
    assert acl == {"team-b": 31, "ops": 31, "anyone": 1}, acl
    before = state_of(team_b, "b", "lake.db.b")

    p = team_a.paths
    refusals = {
        "fence": lambda: team_a.fence_job("b"),
        "unregister": lambda: team_a.unregister_job("b", confirm=True, catalog=catalog_settings,
                                                    allow_unfenced=True),
        "lead": lambda: team_a.leadership("b").acquire(timeout=5),
        "commit an epoch": lambda: team_a.multi([Create(p.epoch("b", 2000), b"{}")]),
        "move the tidemark": lambda: team_a.multi(
            [SetData(p.tidemark("lake.db.b"), TableTidemark("lake.db.b", 9000, 1, 9000, 9000).to_json())]),
        "re-register with other tables": lambda: team_a.register_job("b", sources=[], sinks=["lake.db.x"],
                                                                     replace=True),
        "pause": lambda: team_a.pause_job("b"),
        "delete the claim": lambda: team_a.multi([Delete(p.tidemark("lake.db.b")), Delete(p.table("lake.db.b"))]),
    }
    leadership_released = False
    for what, attempt in refusals.items():
        if what == "unregister" and not leadership_released:  # unregistering is refused first for a live leader
            leadership.release()
            leadership_released = True
            before = state_of(team_b, "b", "lake.db.b")
        with pytest.raises(PermissionDenied, match=r"job identity 'team-a'.*NoAuth.*TIDEMARK_ZK_OPERATOR_USER"):
            attempt()
        assert state_of(team_b, "b", "lake.db.b") == before, what
    # The server itself refuses it, not only Tidemark's own checks.
    with pytest.raises(NoAuthError):
        team_a.client.set(p.term("b"), b'{"term": 99}')
    with pytest.raises(NoAuthError):
        team_a.client.delete(p.epoch("b", 1000))

    # The command line says so in one line.
    as_job(monkeypatch, TEAM_A)
    code, _, err = run_cli(capsys, "--zk", zk_connect, "fence", "b", "--yes")
    assert_one_line_error(code, err, "NoAuth", "job identity 'team-a'")
    assert state_of(team_b, "b", "lake.db.b") == before

    # b itself goes on; a still runs its own job.
    leadership = team_b.leadership("b")
    leadership.acquire()
    run_epoch(EpochCoordinator(leadership, ["lake.db.b"]), 2000, "lake.db.a", "lake.db.b")
    assert team_a.tidemarks(["lake.db.b"])["lake.db.b"].epoch == 2000  # and reads b's tidemark
    own = team_a.leadership("a")
    own.acquire()
    run_epoch(EpochCoordinator(own, ["lake.db.a"]), 2000, "raw.in", "lake.db.a")

    # The operator fences and unregisters any job.
    operator.fence_job("b")
    with pytest.raises(Fenced):
        run_epoch(EpochCoordinator(leadership, ["lake.db.b"]), 3000, "lake.db.a", "lake.db.b")
    leadership.release()
    operator.unregister_job("b", confirm=True, catalog=catalog_settings, allow_unfenced=True)
    assert set(operator.topology().jobs) == {"a"}
    team_b.register_job("b", sources=["lake.db.a"], sinks=["lake.db.b"])  # and b registers itself again
    assert set(operator.topology().jobs) == {"a", "b"}


@pytest.mark.timeout(240)  # a hang (a refusal retried forever) fails here, not after the suite's limit
def test_two_epoch_writers_each_with_its_own_identity_commit_a_chain(connect, catalog_settings, namespace):
    """What users do with job identities: each job's driver runs the full ``EpochWriter`` loop (election,
    leadership, epochs, publishing, tidemarks) under its own identity; the derived job reads the root's."""
    connect(auth=WRITER, operator=OPERATOR)  # `tidemark init`
    catalog = catalog_settings.load()
    events, a_out, b_out = f"{namespace}.events", f"{namespace}.a_out", f"{namespace}.b_out"
    create_table(catalog, events, first_snapshot=False).append(rows(0, range(3)))
    create_table(catalog, a_out, first_snapshot=False)
    create_table(catalog, b_out, first_snapshot=False)

    def copy(source: str, sink: str):
        def step(ctx) -> None:
            new = ctx.changes(source)
            if new.num_rows:
                ctx.append(sink, new)
        return step

    def writer(job: str, identity: tuple[str, str], sources: list[str], sinks: list[str]) -> EpochWriter:
        tm = connect(auth=WRITER, job=identity, operator=OPERATOR[0])
        return EpochWriter(tm, job, sources=sources, sinks=sinks, catalog=catalog_settings, interval_ms=500,
                           grace_ms=100, log_every=1.0)

    epochs = 4
    # a runs until stopped, so b always finds a newer tidemark of a's to read up to.
    a = Runner(writer("a", TEAM_A, [events], [a_out]), copy(events, a_out), leader_timeout=30)
    b = Runner(writer("b", TEAM_B, [a_out], [b_out]), copy(a_out, b_out), max_epochs=epochs, leader_timeout=30)
    try:
        def b_done() -> bool:
            a.check()
            b.check()
            return len(a.writer.committed) >= epochs and b.done
        wait_for(b_done, f"a to commit and b to finish {epochs} epochs", timeout=150)
    finally:
        a.stop(timeout=30)
        b.stop(timeout=30)
    assert b.result is not None and len(b.result) == epochs, b.result
    a_epochs = a.writer.committed

    reader = connect(auth=WRITER)
    p = reader.paths
    # Each job's znodes carry its own identity, never the other's.
    for job, owner, last in (("a", TEAM_A[0], a_epochs[-1]), ("b", TEAM_B[0], b.result[-1])):
        acl = {e.id.id.split(":")[0]: e.perms for e in reader.client.get_acls(p.epoch(job, last))[0]}
        assert acl == {owner: 31, OPERATOR[0]: 31, "anyone": 1}, (job, acl)
    marks = reader.tidemarks([a_out, b_out])
    assert marks[a_out].epoch == a_epochs[-1] and marks[b_out].epoch == b.result[-1]
    # b read a's tidemark: each of its epochs read a's sink up to the snapshot a published at that epoch.
    for epoch in b.result:
        record = present(reader.read(p.epoch("b", epoch), EpochRecord))[0]
        upstream = present(reader.read(p.epoch("a", epoch), EpochRecord))[0]
        assert record.inputs.sources[a_out].end == upstream.published[a_out], epoch
    assert as_set(catalog.load_table(b_out).scan().to_arrow()) == as_set(catalog.load_table(events).scan().to_arrow())

    version = Resolver(catalog, catalog_settings, reader).resolve([a_out, b_out])
    assert version.epoch == b.result[-1], (version, b.result)  # the newest epoch both sinks hold
    for name in (a_out, b_out):
        at = catalog.load_table(name).scan(snapshot_id=version.snapshots[name]).to_arrow()
        assert as_set(at) == [(0, 0), (0, 1), (0, 2)], (name, version)


def test_a_job_identity_needs_the_operator_to_have_set_up_the_tree(connect, monkeypatch, capsys, zk_connect):
    with pytest.raises(ConfigurationError, match="tidemark init"):
        connect(auth=WRITER, job=TEAM_A, operator=OPERATOR[0])
    for name, value in zip(("TIDEMARK_ZK_USER", "TIDEMARK_ZK_PASSWORD", "TIDEMARK_ZK_OPERATOR_USER",
                            "TIDEMARK_ZK_OPERATOR_PASSWORD"), (*WRITER, *OPERATOR)):
        monkeypatch.setenv(name, value)
    code, out, err = run_cli(capsys, "--zk", zk_connect, "init")
    assert code == 0 and "operator identity 'ops'" in out, err
    # The layout the job's session made first now names the operator too: the job comes up.
    jobs_acl = connect(auth=WRITER).client.get_acls("/tidemark/jobs")[0]
    assert make_digest_acl(*OPERATOR, all=True) in jobs_acl
    connect(auth=WRITER, job=TEAM_A, operator=OPERATOR[0]).register_job("a", sources=[], sinks=["lake.db.a"])


def test_one_shared_identity_works_as_before(connect):
    """No job identity: the writer's ACL on every znode, and the writer may fence and unregister any job."""
    writer = connect(auth=WRITER)
    writer.register_job("a", sources=[], sinks=["lake.db.a"])
    acl = writer.client.get_acls(writer.paths.term("a"))[0]
    assert acl == [make_digest_acl(*WRITER, all=True), *writer.credentials.default_acl()[1:]]
    assert connect(auth=WRITER).fence_job("a") == 1


@pytest.fixture
def zk_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path))
    return tmp_path


def test_tidemark_zk_start_with_credentials_refuses_anonymous_clients(zk_home, monkeypatch, capsys):
    port = free_port()
    monkeypatch.setenv("TIDEMARK_ZK_USER", WRITER[0])
    monkeypatch.setenv("TIDEMARK_ZK_PASSWORD", WRITER[1])
    code, out, err = run_cli(capsys, "zk", "start", "--port", str(port))
    assert code == 0 and out.strip() == f"127.0.0.1:{port}" and "refuses clients without credentials" in err, err
    try:
        assert "enforce.auth.enabled=true" in (zk_home / "zookeeper" / "zoo.cfg").read_text()
        anonymous = KazooClient(f"127.0.0.1:{port}", timeout=4)
        anonymous.start(timeout=20)
        try:  # the server closes its session at its first request, whatever it is
            with pytest.raises(SessionClosedRequireSaslError):
                anonymous.create("/squatted", b"")
        finally:
            anonymous.stop()
            anonymous.close()

        writer = Tidemark.connect(f"127.0.0.1:{port}", auth=WRITER, operation_timeout=10)
        with writer:
            writer.register_job("a", sources=[], sinks=["lake.db.a"])
            assert writer.client.exists("/squatted") is None

        # Tidemark without credentials: one line saying what to set, at once.
        for name in CRED_VARS:
            monkeypatch.delenv(name, raising=False)
        code, _, err = run_cli(capsys, "--zk", f"127.0.0.1:{port}", "--timeout", "10", "status")
        assert_one_line_error(code, err, "the server requires authentication: set TIDEMARK_ZK_USER")
        with pytest.raises(PermissionDenied, match="requires authentication"):
            Tidemark.connect(f"127.0.0.1:{port}", operation_timeout=10)
        # A reader identity gets in and reads.
        monkeypatch.setenv("TIDEMARK_ZK_READER_USER", "dashboards")
        monkeypatch.setenv("TIDEMARK_ZK_READER_PASSWORD", "r3ad")
        code, out, err = run_cli(capsys, "--zk", f"127.0.0.1:{port}", "--timeout", "10", "status", "--json")
        assert code == 0 and [j["name"] for j in json.loads(out)["jobs"]] == ["a"], err
    finally:
        code, out, _ = run_cli(capsys, "zk", "stop")
        assert code == 0 and out.strip() == "stopped"

