"""Tidemark's coordinator: ZooKeeper protocol and Iceberg metadata, in pure Python (never imports Spark)."""
from .barriers import BarrierGrid, Barriers
from .catalog import CatalogSettings
from .client import Tidemark, TlsSettings
from .epochs import EpochCoordinator, Recovery, RecoveryAction
from .errors import (ConfigurationError, CorruptState, CycleError, EpochOrderError, Fenced, InvalidName, JobNotFound,
                     NotLeader, PermissionDenied, PublishConflict, RegistrationError, TableNotFound, TidemarkError,
                     TlsError, VersionNotFound, WriterConflict, ZooKeeperUnavailable)
from .leadership import Leadership, LeaderState
from .records import (BarrierMode, ConsistencyLevel, ConsistentVersion, EpochInputs, EpochRecord, EpochState,
                      JobRecord, SourceRange, TableTidemark)
from .topology import Topology
from .writer import EpochContext, EpochWriter, Waiting
from .zookeeper_server import EmbeddedZooKeeper

__all__ = [
    "BarrierGrid", "BarrierMode", "Barriers", "CatalogSettings", "ConfigurationError", "ConsistencyLevel",
    "ConsistentVersion", "CorruptState", "CycleError", "EmbeddedZooKeeper", "EpochContext", "EpochCoordinator",
    "EpochInputs", "EpochOrderError", "EpochRecord", "EpochState", "EpochWriter", "Fenced", "InvalidName", "JobNotFound", "JobRecord", "LeaderState", "Leadership",
    "NotLeader", "PermissionDenied", "PublishConflict", "Recovery", "RecoveryAction", "RegistrationError", "SourceRange",
    "TableNotFound", "TableTidemark", "Tidemark", "TidemarkError", "TlsError", "TlsSettings", "Topology", "VersionNotFound", "Waiting",
    "WriterConflict", "ZooKeeperUnavailable",
]
