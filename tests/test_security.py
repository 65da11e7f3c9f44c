"""ACLs on a real ZooKeeper: the server itself refuses what an identity may not do, whoever touched the tree first."""
from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl

from coordinator import EmbeddedZooKeeper, PermissionDenied, Tidemark
from coordinator.history.resolve import ReaderSession, Resolver
from coordinator.operations.zookeeper_server import free_port
from coordinator.zookeeper.security import is_open
from tests.helpers.cli import run_cli

WRITER = ("etl", "s3cret")
READER = ("dashboards", "r3ad")
CRED_VARS = ("TIDEMARK_ZK_USER", "TIDEMARK_ZK_PASSWORD", "TIDEMARK_ZK_READER_USER", "TIDEMARK_ZK_READER_PASSWORD")


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch):
    for name in CRED_VARS:
        monkeypatch.delenv(name, raising=False)



@pytest.fixture
def raw(zk_connect):
    """A bare kazoo session on the test's chroot, with no credentials: the hostile client."""
    server, chroot = zk_connect.split("/", 1)
    client = KazooClient(server)
    client.start(timeout=30)
    client.ensure_path("/" + chroot)
    client.chroot = "/" + chroot
    yield client
    client.stop()
    client.close()


def test_a_tree_first_touched_unauthenticated_is_secured_by_the_writer(zk_connect, connect, capsys, raw):
    code, out, err = run_cli(capsys, "--zk", zk_connect, "status")  # reading creates nothing, so leaves nothing open
    assert code == 0 and "no jobs registered" in out, err
    assert raw.exists("/tidemark") is None
    connect().close()  # an unauthenticated job (or an older release's status) creates the layout open to anyone
    assert is_open(raw.get_acls("/tidemark/barriers")[0])

    writer = connect(auth=WRITER)  # repairs what the anonymous status created
    writer.register_job("counts", sources=["lake.db.words"], sinks=["lake.db.counts"])
    writer.barriers.ensure_grid(interval_ms=1000)
    term = "/tidemark/jobs/counts/term"
    term_before = raw.get(term)[0]

    for path in ["/tidemark", "/tidemark/topology", "/tidemark/jobs", "/tidemark/tables", "/tidemark/barriers",
                 "/tidemark/readers", "/tidemark/versions", "/tidemark/jobs/counts", term]:
        assert not is_open(raw.get_acls(path)[0]), path
    # The server itself refuses every hostile write: rewrite the grid, fence the job by hand, squat a table.
    with pytest.raises(NoAuthError):
        raw.set("/tidemark/barriers", b'{"interval_ms": 1}')
    with pytest.raises(NoAuthError):
        raw.set(term, b'{"term": 99}')
    with pytest.raises(NoAuthError):
        raw.create("/tidemark/tables/lake.db.squatted", b'{"writer": "evil"}')
    with pytest.raises(NoAuthError):
        raw.set("/tidemark/topology", b'{"version": 99}')
    with pytest.raises(NoAuthError):
        raw.create("/tidemark/jobs/evil", b"{}")

    # Through Tidemark's own API and CLI, the same refusals are one clear error, at once.
    stranger = connect()
    with pytest.raises(PermissionDenied, match="TIDEMARK_ZK_USER"):
        stranger.register_job("evil", sources=[], sinks=["lake.db.squatted"])
    started = time.monotonic()
    code, _, err = run_cli(capsys, "--zk", zk_connect, "fence", "counts", "--yes")
    assert code == 1 and err.startswith("tidemark: error: ") and err.count("\n") == 1, err
    assert "NoAuth" in err and time.monotonic() - started < 5
    assert raw.get(term)[0] == term_before and writer.topology().writer_of("lake.db.squatted") is None

    # The real writer still registers, from a new session too.
    connect(auth=WRITER).register_job("more", sources=["lake.db.counts"], sinks=["lake.db.more"])
    assert stranger.topology().writer_of("lake.db.more") == "more"  # world-readable without a reader identity


def test_a_reader_identity_reads_and_pins_but_nobody_else_reads(zk_connect, connect, capsys, monkeypatch,
                                                                 catalog_settings):
    writer = connect(auth=WRITER, reader=READER)
    writer.register_job("counts", sources=[], sinks=["lake.db.counts"])

    reader = connect(reader=READER)  # the reader identity only: a read-only session
    assert reader.topology().writer_of("lake.db.counts") == "counts"
    with pytest.raises(PermissionDenied):
        reader.fence_job("counts")
    session = ReaderSession(Resolver(catalog_settings.load(), catalog_settings, reader), reader)
    session._pinned[1000] = {"lake.db.counts": None}
    session._write_pins()  # readers may create their pins under /readers
    assert writer.children(writer.paths.readers) == [session.reader_id]
    session.close()

    code, _, err = run_cli(capsys, "--zk", zk_connect, "status")
    assert code == 1 and "NoAuth" in err and err.count("\n") == 1, err
    monkeypatch.setenv("TIDEMARK_ZK_READER_USER", READER[0])
    monkeypatch.setenv("TIDEMARK_ZK_READER_PASSWORD", READER[1])
    code, out, err = run_cli(capsys, "--zk", zk_connect, "status")
    assert code == 0 and "counts" in out, err


def test_open_nodes_the_writer_may_not_repair_refuse_the_connection(zk_connect, raw):
    anyone_but_admin = [make_acl("world", "anyone", read=True, write=True, create=True, delete=True)]
    raw.create("/tidemark", b"", makepath=True)
    raw.create("/tidemark/jobs", b"", acl=anyone_but_admin)
    with pytest.raises(PermissionDenied, match=r"/tidemark/jobs was created by an unauthenticated client.*setAcl"):
        Tidemark.connect(zk_connect, auth=WRITER, session_timeout=4, operation_timeout=20)


def test_a_root_only_the_ensemble_admin_may_read_does_not_stop_tidemark_in_its_chroot(tmp_path):
    """A shared ensemble may lock ``/`` down to its admin: Tidemark, confined to its chroot, never needs to read it
    (the question ``connect`` asks first, for a server that requires authentication, is ``exists``)."""
    server = EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path / "zookeeper").start()
    admin = KazooClient(hosts=server.connect_string, auth_data=[("digest", "admin:secret")])
    admin.start(timeout=30)
    try:
        admin.create("/team", acl=OPEN_ACL_UNSAFE)
        admin.set_acls("/", [make_digest_acl("admin", "secret", all=True)])
        anonymous = KazooClient(hosts=server.connect_string)
        anonymous.start(timeout=30)
        try:
            with pytest.raises(NoAuthError):
                anonymous.get("/")
        finally:
            anonymous.stop()
            anonymous.close()
        with Tidemark.connect(server.connect_string + "/team", operation_timeout=20) as tm:
            tm.register_job("a", sources=[], sinks=["lake.db.a"])
        with Tidemark.connect(server.connect_string + "/team", operation_timeout=20, read_only=True) as reader:
            assert "a" in reader.children(reader.paths.jobs)
    finally:
        admin.set_acls("/", OPEN_ACL_UNSAFE)
        admin.stop()
        admin.close()
        server.stop()
