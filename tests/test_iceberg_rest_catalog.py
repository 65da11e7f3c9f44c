"""Tidemark on a second REST catalog implementation: Iceberg's own ``RESTCatalogServer`` (Java, a JdbcCatalog in
PostgreSQL), its files on SeaweedFS's S3 gateway (``tests/helpers/iceberg_rest_server.py``), so that Tidemark is not
tuned to one server's quirks.

The tests are those that run on SeaweedFS's catalog (``tests/test_lakehouse.py``) and on the SQL catalog
(``tests/test_iceberg.py``, ``tests/test_commit_races.py``, ``tests/test_staging.py``), taken from their modules as
they are and run here on this server: this module's ``lakehouse`` fixture is the Iceberg REST server (with the
attributes of SeaweedFS's ``EmbeddedLakehouse`` those tests use), and ``catalog_settings`` / ``catalog`` are its
catalog. Here the fault test's kill -9 hits the catalog alone: the object store stays up. What the server answers
differently from SeaweedFS's is listed in the helper's docstring; its answers to conditional commits (409, 400) and
its 404s are tested below.
"""
from __future__ import annotations

import pytest
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, NoSuchNamespaceError

from coordinator.errors import ConfigurationError, TableNotFound
from coordinator.iceberg import publish
from coordinator.iceberg.catalog import load_table
from coordinator.iceberg.publish import PublishOutcome, publish_staged, publish_together
from coordinator.iceberg.snapshots import snapshot_epoch
from coordinator.iceberg.staging import stage_append
from coordinator.iceberg.transactions import supports_multi_table_commit
from coordinator.operations.lakehouse_server import EmbeddedLakehouse
from tests import test_commit_races as races
from tests import test_iceberg as sql_catalog
from tests import test_lakehouse as seaweedfs
from tests import test_staging as staging
from tests.helpers.iceberg_rest_server import IcebergRestServer
from tests.helpers.lake import create_table, lead_job, rows_of, stage_rows
from tests.helpers.lakehouse_data import lakehouse_data_dir
from tests.helpers.present import present


@pytest.fixture(scope="module")
def object_store(tmp_path_factory):
    """SeaweedFS, for its S3 gateway (its own catalog is not used here)."""
    with lakehouse_data_dir(tmp_path_factory.mktemp("seaweedfs")) as data, EmbeddedLakehouse(data) as running:
        yield running


@pytest.fixture(scope="module")
def lakehouse(object_store, postgres_uri, tmp_path_factory):
    """Iceberg's REST catalog server, its catalog in its own database on the tests' PostgreSQL server."""
    server = IcebergRestServer(tmp_path_factory.mktemp("iceberg-rest"), postgres_uri=postgres_uri,
                               s3_endpoint=object_store.s3_endpoint)
    try:
        server.start()
    except ConfigurationError as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()


@pytest.fixture
def catalog_settings(lakehouse):
    return lakehouse.catalog_settings()


@pytest.fixture
def catalog(catalog_settings):
    return catalog_settings.load()


# -- the lakehouse's tests (tests/test_lakehouse.py), on this server ------------------------------------------------

rest_settings = seaweedfs.rest_settings
test_pyicebergs_own_variables_are_the_whole_configuration = (
    seaweedfs.test_pyicebergs_own_variables_are_the_whole_configuration)
test_python_writers_run_a_cascade_on_s3_and_the_rest_catalog_exactly_once = (
    seaweedfs.test_python_writers_run_a_cascade_on_s3_and_the_rest_catalog_exactly_once)
test_the_tidemark_command_operates_the_rest_catalog_from_pyicebergs_variables = (
    seaweedfs.test_the_tidemark_command_operates_the_rest_catalog_from_pyicebergs_variables)
test_a_writer_rides_out_the_lakehouse_killed_and_restarted_and_loses_nothing = (
    seaweedfs.test_a_writer_rides_out_the_lakehouse_killed_and_restarted_and_loses_nothing)
test_orphan_files_are_found_by_listing_s3_and_deleted_leaving_every_snapshot_readable = (
    seaweedfs.test_orphan_files_are_found_by_listing_s3_and_deleted_leaving_every_snapshot_readable)
test_commits_whose_outcome_is_unknown_are_read_back_and_never_made_twice = (
    seaweedfs.test_commits_whose_outcome_is_unknown_are_read_back_and_never_made_twice)

# -- conditional commits (tests/test_iceberg.py, tests/test_commit_races.py), on this server -------------------------

test_racing_publishers_of_one_epoch_make_exactly_one_snapshot_current = (
    sql_catalog.test_racing_publishers_of_one_epoch_make_exactly_one_snapshot_current)
test_publish_whose_parent_moved_is_refused_and_loses_nothing = (
    sql_catalog.test_publish_whose_parent_moved_is_refused_and_loses_nothing)
test_staging_does_not_hide_a_value_error_of_its_own = races.test_staging_does_not_hide_a_value_error_of_its_own
test_publishing_whose_commit_state_is_unknown_finds_it_published = (
    races.test_publishing_whose_commit_state_is_unknown_finds_it_published)


# -- staging with no catalog commit (tests/test_staging.py), on this server ------------------------------------------

STAGING_TESTS = ("test_a_staged_write_commits_nothing_and_publishes_in_one_commit",
                 "test_an_append_to_a_table_with_no_snapshot_publishes_with_no_empty_snapshot",
                 "test_a_write_built_on_a_head_another_snapshot_outnumbered_is_built_again",
                 "test_an_overwrite_built_again_replaces_every_row_of_the_new_head",
                 "test_a_write_whose_main_another_writer_moved_is_refused",
                 "test_a_roll_forward_whose_staged_files_are_gone_says_so")
globals().update({name: getattr(staging, name) for name in STAGING_TESTS})


# A REST catalog applies a commit's updates itself and answers 400 for an update that no longer applies to the
# table's newer metadata (a stale sequence number, a ref to a snapshot expired meanwhile), where pyiceberg's own
# commits to a SQL catalog raise a ValueError: ``publish.stale_update_as_lost_race`` takes it for a lost race.
test_a_publish_that_lost_a_race_is_retried_from_a_fresh_load = (
    races.test_a_publish_that_lost_a_race_is_retried_from_a_fresh_load)
test_a_publish_that_keeps_losing_raises_publish_conflict = (
    races.test_a_publish_that_keeps_losing_raises_publish_conflict)
test_publishing_a_snapshot_expired_after_the_load_raises_publish_conflict = (
    races.test_publishing_a_snapshot_expired_after_the_load_raises_publish_conflict)


def test_a_publish_on_stale_metadata_is_answered_409_and_finds_its_epoch_published(catalog, namespace, monkeypatch):
    """Two publishers of one epoch, the second on metadata loaded before the first published: its commit's
    requirement that ``main`` is unchanged (assert-ref-snapshot-id) is stale, the server answers 409, and Tidemark
    reads the table again and finds the epoch published: one snapshot of it in ``main``, not two."""
    table = create_table(catalog, f"{namespace}.t")
    first, second = (stage_rows(table, 1000, "j", 1, 2) for _ in range(2))
    stale = catalog.load_table(f"{namespace}.t")  # both staged snapshots, main at the empty head
    assert publish_staged(table, first, 1000, 1).outcome == PublishOutcome.PUBLISHED
    commit_table, refused = stale.catalog.commit_table, []

    def answered(*args, **kwargs):
        try:
            return commit_table(*args, **kwargs)
        except CommitFailedException as exc:
            refused.append(str(exc))
            raise
    monkeypatch.setattr(stale.catalog, "commit_table", answered)
    result = publish_staged(stale, second, 1000, 1)
    assert (result.outcome, result.snapshot_id) == (PublishOutcome.ALREADY_PUBLISHED, first)
    assert len(refused) == 1 and "branch main has changed" in refused[0], refused
    assert stale.current_snapshot().snapshot_id == first
    assert sorted(stale.scan().to_arrow().column("row").to_pylist()) == [0, 1]


# -- one commit for an epoch's sinks: this server has multi-table commits (SeaweedFS's has not) ----------------------

def _spy_on_transactions(monkeypatch, answer_lost: bool = False) -> list[list[str]]:
    """Every multi-table commit the publish sends, by the tables it names; ``answer_lost``: each lands, and its
    answer is a 502 (the outcome unknown)."""
    sent: list[list[str]] = []
    commit = publish.commit_tables

    def spy(catalog, changes):
        sent.append(sorted(".".join(c.table.name()) for c in changes))
        commit(catalog, changes)
        if answer_lost:
            raise CommitStateUnknownException("502 Bad Gateway")
    monkeypatch.setattr(publish, "commit_tables", spy)
    return sent


@pytest.mark.parametrize("answer_lost", [False, True], ids=["answered", "answer-lost"])
def test_an_epochs_sinks_are_published_in_one_multi_table_commit(catalog, catalog_settings, connect, tm, namespace,
                                                                  monkeypatch, answer_lost):
    assert supports_multi_table_commit(catalog)
    sinks = [f"{namespace}.left", f"{namespace}.right"]
    for sink in sinks:
        create_table(catalog, sink)
    writer = lead_job(connect(), catalog_settings, "pair", sinks)

    def both(ctx) -> None:
        for sink in sinks:
            ctx.append(sink, rows_of(ctx.epoch, 2))
    writer.process(1000, both)  # the first epoch is marked in each sink too (tidemark.first-epoch)
    sent = _spy_on_transactions(monkeypatch, answer_lost)
    one_by_one: list[tuple] = []
    commit_table = writer.catalog.commit_table

    def commit_one(*args, **kwargs):
        one_by_one.append(args)
        return commit_table(*args, **kwargs)
    monkeypatch.setattr(writer.catalog, "commit_table", commit_one)
    before = {sink: len(catalog.load_table(sink).metadata.metadata_log) for sink in sinks}

    writer.process(2000, both)

    assert sent == [sinks] and one_by_one == [], "one commit for both sinks, and no other"
    for sink in sinks:
        table = catalog.load_table(sink)
        assert len(table.metadata.metadata_log) == before[sink] + 1
        assert [snapshot_epoch(s) for s in table.snapshots()].count(2000) == 1, "published once"
        assert sorted(table.scan().to_arrow()["epoch"].to_pylist()) == [1000, 1000, 2000, 2000]
    assert {t: present(m).epoch for t, m in tm.tidemarks(sinks).items()} == dict.fromkeys(sinks, 2000)
    writer.close()


def test_a_multi_table_commit_that_lost_a_race_is_retried_and_built_again(catalog, catalog_settings, namespace,
                                                                          monkeypatch):
    """One of the tables got a snapshot on another branch after the writer's load: the server refuses the whole
    commit (nothing lands), and the retry, on the reloaded tables, builds that table's write again."""
    names = [f"{namespace}.a", f"{namespace}.b"]
    tables = {name: create_table(catalog, name) for name in names}
    writes = {name: stage_append(table, rows_of(3000, 2), 3000, "j", 1) for name, table in tables.items()}
    staging.outnumber(catalog, tables[names[1]])
    sent = _spy_on_transactions(monkeypatch)

    results = publish_together(tables, {n: (w.snapshot_id, w) for n, w in writes.items()}, 3000, term=1)

    assert len(sent) == 2, "the refused commit, then the one that landed"
    assert results[names[0]].snapshot_id == writes[names[0]].snapshot_id
    assert results[names[1]].snapshot_id != writes[names[1]].snapshot_id, "built again on the new head"
    assert all(r.outcome == PublishOutcome.PUBLISHED for r in results.values())
    for name in names:
        assert sorted(catalog.load_table(name).scan().to_arrow()["epoch"].to_pylist()) == [3000, 3000]


def test_a_table_or_namespace_that_does_not_exist_is_table_not_found(catalog, catalog_settings, namespace):
    """A 404 of either kind (the server says ``NoSuchTableException`` for a table in a missing namespace, where
    listing that namespace's tables is ``NoSuchNamespaceException``) is Tidemark's ``TableNotFound``."""
    create_table(catalog, f"{namespace}.present")
    for missing in (f"{namespace}.absent", f"{namespace}_absent.t"):
        with pytest.raises(TableNotFound, match=missing):
            load_table(catalog, catalog_settings, missing)
    with pytest.raises(NoSuchNamespaceError):
        catalog.list_tables(f"{namespace}_absent")  # SeaweedFS's catalog answers an empty list
