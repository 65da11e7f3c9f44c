"""Tidemark's coordinator: the ZooKeeper protocol and the Iceberg metadata rules, in pure Python (never imports Spark).

The public API is what this module exports. Underneath, each sub-package holds one concern and
imports only the ones listed before it:

- ``errors``, ``names``, ``records``, ``settings``, ``formatting``, ``crashpoints``: the error hierarchy,
  name rules, the records stored in znodes and snapshot summaries, the environment's configuration, how
  times and durations are written for people, and the crash points fault tests set from it (the
  foundation every other module uses);
- ``coordinator.zookeeper``: the session, multi-operations, znode paths, ACLs and TLS;
- ``coordinator.iceberg``: catalogs, snapshot summaries, staging, publishing, progress records;
- ``coordinator.protocol``: the ZooKeeper recipes (topology, registry, leadership, barriers,
  epochs, tidemarks, status);
- ``coordinator.history``: consistent reads, retained versions and garbage collection;
- ``coordinator.job``: the epoch loop that runs in a driver, with its metrics;
- ``coordinator.tidemark``: ``Tidemark``, the session with the recipes at hand;
- ``coordinator.operations``: the ``tidemark`` command, the exporter and the local ZooKeeper server.
"""
import importlib
from typing import TYPE_CHECKING

from coordinator.errors import (
    ConfigurationError,
    CorruptState,
    CycleError,
    EpochOrderError,
    Fenced,
    GcRunning,
    InputsExpired,
    InvalidArgument,
    InvalidName,
    JobNotFound,
    JobRetired,
    MultiFailed,
    NotLeader,
    PermissionDenied,
    PipelineNotFound,
    PublishConflict,
    RegistrationError,
    SinksNotFenced,
    StorageError,
    TableNotFound,
    TidemarkError,
    TlsError,
    UnregisterNotConfirmed,
    VersionNotFound,
    WriterConflict,
    ZooKeeperRebuilt,
    ZooKeeperUnavailable,
)

if TYPE_CHECKING:  # what mypy and editors see; at run time each name is imported when first used
    from coordinator.history.gc import GarbageCollector
    from coordinator.history.gc_schedule import GcSchedule
    from coordinator.history.readers import (
        VersionReader,
        duckdb_extensions,
        duckdb_iceberg_connection,
        duckdb_iceberg_sql,
        version_sql,
    )
    from coordinator.history.resolve import ReaderSession, Resolver, read_arrow
    from coordinator.history.retention import RetentionPolicy
    from coordinator.iceberg.catalog import CatalogSettings
    from coordinator.job.writer import EpochContext, EpochWriter, Waiting
    from coordinator.operations.zookeeper_server import EmbeddedZooKeeper
    from coordinator.protocol.barriers import BarrierGrid, Barriers
    from coordinator.protocol.epochs import EpochCoordinator, Recovery, RecoveryAction
    from coordinator.protocol.leadership import Leadership, LeaderState
    from coordinator.protocol.pipelines import Pipeline, Pipelines
    from coordinator.protocol.topology import Topology
    from coordinator.records import (
        BarrierMode,
        ConsistencyLevel,
        ConsistentVersion,
        EpochInputs,
        EpochRecord,
        EpochState,
        JobRecord,
        SourceRange,
        TableTidemark,
    )
    from coordinator.tidemark import Tidemark
    from coordinator.zookeeper.security import TlsSettings

# Names imported on first use (PEP 562): `tidemark --version` and `import coordinator.errors` stay quick,
# `from coordinator import EpochWriter` loads what it needs.
_LAZY: dict[str, str] = {name: module for module, names in (
    ("coordinator.history.gc", ("GarbageCollector",)),
    ("coordinator.history.gc_schedule", ("GcSchedule",)),
    ("coordinator.history.readers", (
        "VersionReader", "duckdb_extensions", "duckdb_iceberg_connection", "duckdb_iceberg_sql", "version_sql")),
    ("coordinator.history.resolve", ("ReaderSession", "Resolver", "read_arrow")),
    ("coordinator.history.retention", ("RetentionPolicy",)),
    ("coordinator.iceberg.catalog", ("CatalogSettings",)),
    ("coordinator.job.writer", ("EpochContext", "EpochWriter", "Waiting")),
    ("coordinator.operations.zookeeper_server", ("EmbeddedZooKeeper",)),
    ("coordinator.protocol.barriers", ("BarrierGrid", "Barriers")),
    ("coordinator.protocol.epochs", ("EpochCoordinator", "Recovery", "RecoveryAction")),
    ("coordinator.protocol.leadership", ("Leadership", "LeaderState")),
    ("coordinator.protocol.pipelines", ("Pipeline", "Pipelines")),
    ("coordinator.protocol.topology", ("Topology",)),
    ("coordinator.records", (
        "BarrierMode", "ConsistencyLevel", "ConsistentVersion", "EpochInputs", "EpochRecord", "EpochState",
        "JobRecord", "SourceRange", "TableTidemark")),
    ("coordinator.tidemark", ("Tidemark",)),
    ("coordinator.zookeeper.security", ("TlsSettings",)),
) for name in names}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BarrierGrid", "BarrierMode", "Barriers", "CatalogSettings", "ConfigurationError", "ConsistencyLevel",
    "ConsistentVersion", "CorruptState", "CycleError", "EmbeddedZooKeeper", "EpochContext", "EpochCoordinator",
    "EpochInputs", "EpochOrderError", "EpochRecord", "EpochState", "EpochWriter", "Fenced", "GarbageCollector",
    "GcRunning", "GcSchedule", "InputsExpired", "InvalidArgument", "InvalidName", "JobNotFound", "JobRecord",
    "JobRetired", "LeaderState", "Leadership", "MultiFailed", "NotLeader", "PermissionDenied", "Pipeline",
    "PipelineNotFound", "Pipelines", "PublishConflict",
    "ReaderSession", "Recovery", "RecoveryAction", "RegistrationError", "Resolver", "RetentionPolicy",
    "SinksNotFenced", "SourceRange", "StorageError", "TableNotFound", "TableTidemark", "Tidemark", "TidemarkError",
    "TlsError", "TlsSettings", "Topology", "UnregisterNotConfirmed", "VersionNotFound", "VersionReader", "Waiting",
    "WriterConflict", "ZooKeeperRebuilt", "ZooKeeperUnavailable", "duckdb_extensions", "duckdb_iceberg_connection",
    "duckdb_iceberg_sql", "read_arrow", "version_sql",
]
