"""Pipelines and scopes (``coordinator.protocol.pipelines``): the job graph's connected parts, pure logic."""
from __future__ import annotations

import pytest

from coordinator.errors import InvalidArgument, PipelineNotFound
from coordinator.protocol.pipelines import Group, Pipelines, parse_group
from coordinator.protocol.topology import Topology
from coordinator.records import JobRecord


def _graph() -> Topology:
    return Topology(0, 0, {
        "orders": JobRecord(("pg.orders",), ("db.orders",)),
        "big_orders": JobRecord(("db.orders",), ("db.big_orders",)),
        "word_counts": JobRecord(("lake.raw.lines",), ("lake.db.word_counts",)),
        "histogram": JobRecord(("lake.db.word_counts",), ("lake.db.histogram",)),
        "audit": JobRecord(("pg.orders",), ("sales.audit",)),  # shares a root table with orders: one pipeline
    })


def test_a_pipeline_is_a_connected_part_of_the_graph_named_after_its_first_job():
    pipelines = Pipelines(_graph())
    assert [(p.name, p.jobs) for p in pipelines.all] == [
        ("audit", ("audit", "big_orders", "orders")), ("histogram", ("histogram", "word_counts"))]
    sales = pipelines.named("audit")
    assert sales.tables == ("db.big_orders", "db.orders", "pg.orders", "sales.audit")
    assert pipelines.of_table("lake.db.word_counts") == pipelines.of_job("histogram") == pipelines.named("histogram")
    assert pipelines.of_table("db.elsewhere") is None and pipelines.of_job("nobody") is None
    with pytest.raises(PipelineNotFound, match="pipelines are audit, histogram"):
        pipelines.named("sales")
    with pytest.raises(PipelineNotFound, match="no job is registered"):
        Pipelines(Topology(0, 0, {})).named("sales")


def test_a_pipeline_keeps_its_name_while_jobs_join_it_after_its_first():
    graph = _graph()
    joined = graph.with_job("zz_report", JobRecord(("db.big_orders", "lake.db.histogram"), ("db.report",)))
    names = [(p.name, len(p.jobs)) for p in Pipelines(joined).all]
    assert names == [("audit", 6)], "two pipelines joined by a job are one, named after the first job of both"


def test_the_scopes_group_the_tables_as_tidemark_serve_does():
    pipelines = Pipelines(_graph())
    by_pipeline = pipelines.groups(Group.PIPELINE)
    assert set(by_pipeline) == {"audit", "histogram"}
    assert pipelines.groups(Group.ALL) == {"all": pipelines.tables} and len(pipelines.tables) == 7

    def identifier(table: str) -> str:
        return table.split(".", 1)[1] if table.startswith("lake.") else table
    assert pipelines.groups(Group.NAMESPACE, "db", identifier) == {
        "namespace:db": ("db.big_orders", "db.orders", "lake.db.histogram", "lake.db.word_counts")}
    assert pipelines.groups(Group.NAMESPACE, "nowhere", identifier) == {}


@pytest.mark.parametrize("text, expected", [
    (None, (Group.PIPELINE, None)), ("", (Group.PIPELINE, None)), ("pipeline", (Group.PIPELINE, None)),
    ("all", (Group.ALL, None)), ("namespace:sales", (Group.NAMESPACE, "sales"))])
def test_a_scope_is_parsed_one_way(text, expected):
    assert parse_group(text) == expected


@pytest.mark.parametrize("text", ["everything", "namespace:", "namespace:bad name", "pipelines"])
def test_a_scope_that_names_no_group_says_what_one_is(text):
    with pytest.raises(InvalidArgument, match="scope"):
        parse_group(text)


def test_around_is_what_one_version_of_some_tables_is_consistent_across():
    pipelines = Pipelines(_graph())
    assert pipelines.around(["db.big_orders"], Group.PIPELINE) == pipelines.named("audit").tables
    assert pipelines.around(["lake.db.histogram", "sales.audit"], Group.PIPELINE) == pipelines.tables  # both
    assert pipelines.around(["db.orders"], Group.NAMESPACE, "lake.db") == ("lake.db.histogram", "lake.db.word_counts")
    assert pipelines.around(["db.orders"], Group.ALL) == pipelines.tables
    assert pipelines.around(["db.elsewhere"], Group.PIPELINE) == ()  # no job writes or reads it
    by_identifier = pipelines.around(["orders"], Group.PIPELINE, identifier=lambda t: t.rpartition(".")[2])
    assert by_identifier == pipelines.named("audit").tables, "matched by the identifier, as the catalog names them"
