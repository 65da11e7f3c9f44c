"""Pipelines and scopes: which tables one consistent version is across (docs/design.md, "Pipelines").

    found = Pipelines(topo)                 # the job graph's connected parts
    found.all                               # (Pipeline("orders", jobs=("big_orders", "orders"), tables=...), ...)
    found.of_table("db.big_orders")         # the Pipeline holding it (None: no job writes or reads it)
    found.named("orders")                   # PipelineNotFound, listing the pipelines, for another name
    found.groups(Group.NAMESPACE, "sales", identifier)   # {"namespace:sales": tables}: one scope's groups
    found.around(["db.orders"], Group.PIPELINE)          # what one version of db.orders is consistent across
    parse_group("namespace:sales")          # (Group.NAMESPACE, "sales"); "" and "pipeline" are the default

A *pipeline* is a connected part of the job graph: its jobs, the tables they write and the tables they read (root
tables included: two jobs reading one root table are one pipeline). It is named after its first job by name, so its
name is the same whoever reads the graph, and stays while jobs join it (a job named before the others renames it).
Jobs of one pipeline share epochs; nothing outside a pipeline holds its versions back.

A *scope* groups the tables one version is consistent across: ``pipeline`` (the default: each table with its
pipeline), ``all`` (every table the jobs write or read: one version) or ``namespace:<ns>`` (those of one
namespace); ``resolve`` also takes ``set`` (``SET``: exactly the tables named). ``tidemark serve``, ``resolve``,
``status``, ``gc`` and the metrics all take their groups from here.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from coordinator.errors import InvalidArgument, InvalidName, PipelineNotFound
from coordinator.names import validate_name
from coordinator.protocol.topology import Topology

GROUP_HELP = "a scope is pipeline (each table with its pipeline, the default), all, or namespace:<ns>"
SET = "set"  # resolve's scope of exactly the tables it is given, no wider


class Group(str, enum.Enum):
    """Which tables one version is consistent across (module docstring)."""

    PIPELINE = "pipeline"
    ALL = "all"
    NAMESPACE = "namespace"


@dataclass(frozen=True)
class Pipeline:
    """One connected part of the job graph: its ``name`` (its first job's), its ``jobs`` and its ``tables`` (the
    jobs' sinks and sources, sorted)."""

    name: str
    jobs: tuple[str, ...]
    tables: tuple[str, ...]


class Pipelines:
    """The pipelines of one job graph (module docstring). Makes no request and raises nothing but ``named``'s
    ``PipelineNotFound``.

    :param topology: the job graph (``read_topology``).
    """

    topology: Topology

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    @cached_property
    def all(self) -> tuple[Pipeline, ...]:
        """Every pipeline, by name."""
        jobs_of: dict[str, list[str]] = {}
        for name, job in self.topology.jobs.items():
            for table in (*job.sources, *job.sinks):
                jobs_of.setdefault(table, []).append(name)
        found: list[Pipeline] = []
        placed: set[str] = set()
        for first in sorted(self.topology.jobs):
            if first in placed:
                continue
            jobs, tables, stack = {first}, set(), [first]
            while stack:
                record = self.topology.jobs[stack.pop()]
                for table in (*record.sources, *record.sinks):
                    tables.add(table)
                    for other in jobs_of[table]:
                        if other not in jobs:
                            jobs.add(other)
                            stack.append(other)
            placed |= jobs
            found.append(Pipeline(first, tuple(sorted(jobs)), tuple(sorted(tables))))
        return tuple(found)

    @cached_property
    def tables(self) -> tuple[str, ...]:
        """Every table a job writes or reads, sorted."""
        return tuple(sorted(self._by_table))

    @cached_property
    def _by_table(self) -> dict[str, Pipeline]:
        return {table: pipeline for pipeline in self.all for table in pipeline.tables}

    @cached_property
    def _by_job(self) -> dict[str, Pipeline]:
        return {job: pipeline for pipeline in self.all for job in pipeline.jobs}

    def of_table(self, table: str) -> Optional[Pipeline]:
        """The pipeline whose jobs write or read ``table`` (as the job graph names it), None for any other table."""
        return self._by_table.get(table)

    def of_job(self, job: str) -> Optional[Pipeline]:
        """The pipeline of registered job ``job``, None for a job not registered."""
        return self._by_job.get(job)

    def named(self, name: str) -> Pipeline:
        """The pipeline called ``name``.

        :raises PipelineNotFound: no pipeline has that name (the message lists those there are).
        """
        for pipeline in self.all:
            if pipeline.name == name:
                return pipeline
        names = ", ".join(p.name for p in self.all) or "none: no job is registered"
        raise PipelineNotFound(f"no pipeline is named {name!r}: a pipeline is named after its first job by name, "
                               f"and the pipelines are {names} (`tidemark status` shows each)")

    def groups(self, group: Group, namespace: Optional[str] = None,
               identifier: Optional[Callable[[str], str]] = None) -> Mapping[str, tuple[str, ...]]:
        """The groups of a scope, each its name and its tables: a pipeline's name for ``pipeline``; ``all`` for
        every table; ``namespace:<ns>`` for the tables whose identifier (``identifier``: the catalog's
        ``namespace.name`` form of a table name; the name itself by default) is in ``namespace`` (no group when
        none is)."""
        if group == Group.PIPELINE:
            return {p.name: p.tables for p in self.all}
        if group == Group.ALL:
            return {Group.ALL.value: self.tables} if self.tables else {}
        chosen = tuple(t for t in self.tables if (identifier(t) if identifier else t).rpartition(".")[0] == namespace)
        return {f"{Group.NAMESPACE.value}:{namespace}": chosen} if chosen else {}

    def around(self, tables: Iterable[str], group: Group, namespace: Optional[str] = None,
               identifier: Optional[Callable[[str], str]] = None) -> tuple[str, ...]:
        """The tables (the graph's names) one version of ``tables`` is consistent across in a scope: those of every
        pipeline holding one of them for ``pipeline``, of namespace ``namespace`` for ``namespace``, every table for
        ``all``. Tables are matched by ``identifier`` (as ``groups``), so ``lake.db.t`` and ``db.t`` are one."""
        key = identifier or (lambda table: table)
        wanted = {key(t) for t in tables}
        groups = [g for g in self.groups(group, namespace, identifier).values()
                  if group != Group.PIPELINE or any(key(t) in wanted for t in g)]
        return tuple(sorted({t for g in groups for t in g}))


def parse_group(text: Optional[str]) -> tuple[Group, Optional[str]]:
    """The group a scope's text names (``pipeline``, ``all``, ``namespace:<ns>``; None or "" for ``pipeline``) and
    its namespace.

    :raises InvalidArgument: text that names no group, or a malformed namespace.
    """
    text = (text or "").strip()
    if text in ("", Group.PIPELINE.value):
        return Group.PIPELINE, None
    if text == Group.ALL.value:
        return Group.ALL, None
    kind, colon, namespace = text.partition(":")
    if kind == Group.NAMESPACE.value and colon:
        try:
            return Group.NAMESPACE, validate_name(namespace, "namespace")
        except InvalidName as exc:
            raise InvalidArgument(f"scope {text!r}: {exc}") from None
    raise InvalidArgument(f"scope {text!r} names no group: {GROUP_HELP}")


__all__ = ["GROUP_HELP", "SET", "Group", "Pipeline", "Pipelines", "parse_group"]
