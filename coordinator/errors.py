"""Every error Tidemark raises on purpose: one hierarchy, one module.

Each message says what is wrong and what to do about it; callers catch
``TidemarkError`` to handle all of them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Protocol


class FailedOp(Protocol):
    """What ``MultiFailed`` says of the operation that failed (``zookeeper.ops.Op`` has it)."""

    @property
    def kind(self) -> str: ...

    @property
    def path(self) -> str: ...


class PlannedUnregistration(Protocol):
    """What the unregistration errors say of the plan they refuse (``protocol.registry.UnregisterPlan`` has it)."""

    @property
    def job(self) -> str: ...

    @property
    def sinks(self) -> Sequence[str]: ...

    @property
    def unreadable(self) -> Optional[str]: ...

    def describe(self) -> str: ...


class TidemarkError(Exception):
    """Base of every error Tidemark raises on purpose."""


class ConfigurationError(TidemarkError):
    """A setting, a path, a URI or a required program is missing or malformed."""


class InvalidArgument(TidemarkError, ValueError):
    """A value handed to a record or a recipe is out of range or of the wrong type (decoders turn it into
    ``CorruptState`` naming the znode)."""


class InvalidName(TidemarkError, ValueError):
    """A job, table or member name that could not be used safely as a znode name."""


class ZooKeeperUnavailable(TidemarkError):
    """ZooKeeper could not be reached before the operation's deadline."""


class ZooKeeperRebuilt(TidemarkError):
    """The ZooKeeper server is behind this session: its data was deleted or restored from an older copy while
    this process was connected (it refuses a session that has seen newer transactions than its own), or the
    session's tree is gone under a new session. This session can never come back: restart the process; a
    driver registers its job again and resumes from its sinks' Iceberg metadata. ``what`` says what happened."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: restart this process (a driver registers its job again and resumes from Iceberg)")
        self.what = what


class CorruptState(TidemarkError):
    """A znode holds data Tidemark cannot parse; the message names the znode."""


class RegistrationError(TidemarkError):
    """A job registration was refused."""


class WriterConflict(RegistrationError):
    """A table already has another writer job (one table, one writer)."""

    def __init__(self, table: str, owner: str, job: str) -> None:
        super().__init__(
            f"table {table!r} is already written by job {owner!r}; job {job!r} cannot write it too "
            f"(one table, one writer). Unregister {owner!r} first or write a different table."
        )
        self.table, self.owner, self.job = table, owner, job


class CycleError(RegistrationError):
    """A registration would close a cycle in the job graph."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__(
            "registration refused: it would close the cycle " + " ".join(cycle)
            + "; a job may not (transitively) read a table it writes"
        )
        self.cycle = cycle


class JobNotFound(TidemarkError):
    """The named job is not registered."""


class PipelineNotFound(TidemarkError):
    """No pipeline of the job graph has the given name (a pipeline is named after its first job by name)."""


class JobRetired(TidemarkError):
    """An operator retired the job (``tidemark retire``): no driver may lead it until ``tidemark resume``."""


class NotLeader(TidemarkError):
    """This process does not (or no longer) lead the job, or may not commit right now."""


class Fenced(NotLeader):
    """A newer leader (or an operator) has taken over this job: this process is a zombie."""


class EpochOrderError(TidemarkError):
    """An epoch call out of order: duplicate, skipped barrier, or a step of the wrong state."""


class PublishConflict(TidemarkError):
    """A staged snapshot could not be published because the table's main branch moved."""


class GcRunning(TidemarkError):
    """Another process holds the deployment's garbage-collection lock: one run at a time, whoever starts it."""


class TableNotFound(TidemarkError):
    """An Iceberg table named by the caller does not exist in the catalog."""


class StorageError(TidemarkError):
    """The warehouse's file system refused to list or delete a table's files (credentials, permissions), or its STS
    issued no credentials to vend."""


class VersionNotFound(TidemarkError):
    """No consistent version exists for the requested epoch (expired, or never committed)."""


class InputsExpired(TidemarkError):
    """Snapshots of a source between a job's last epoch and its next were expired outside Tidemark (a catalog's or
    another engine's maintenance): the rows appended in between cannot be told, so the epoch is not computed."""


class PermissionDenied(TidemarkError):
    """ZooKeeper refused an operation because the znode's ACL does not allow this session's identity."""


class TlsError(ConfigurationError):
    """A TLS certificate or protocol mismatch with ZooKeeper; the message names the likely cause."""


class MultiFailed(TidemarkError):
    """A ZooKeeper multi was rolled back: ``op`` is the operation that failed, ``error`` the ZooKeeper error.

    Usually another process changed the same znodes meanwhile; the recipes retry or explain it.
    """

    def __init__(self, op: FailedOp, error: Exception) -> None:
        super().__init__(f"ZooKeeper refused a change ({op.kind} {op.path}: {type(error).__name__}): another "
                         "process changed the same state meanwhile; see `tidemark status` and try again")
        self.op, self.error = op, error


class UnregisterNotConfirmed(RegistrationError):
    """``unregister_job`` was called without ``confirm=True``; ``plan`` says what it would remove and what a
    re-registration would resume from."""

    def __init__(self, plan: PlannedUnregistration) -> None:
        super().__init__(f"{plan.describe()}. Nothing was changed: confirm to go ahead "
                         "(`tidemark unregister --yes`, or unregister_job(..., confirm=True))")
        self.plan = plan


class SinksNotFenced(RegistrationError):
    """``unregister_job`` could not fence the job's sinks in Iceberg (catalog unreachable or not
    configured, a sink missing), so it changed nothing: a still-running leader of this registration
    could otherwise commit to them again, and the next registration could reuse its terms."""

    def __init__(self, plan: PlannedUnregistration) -> None:
        super().__init__(
            f"cannot unregister job {plan.job}: its sinks ({', '.join(plan.sinks)}) cannot be fenced in "
            f"Iceberg ({plan.unreadable}). Nothing was changed: give the catalog settings (TIDEMARK_CATALOG_NAME, "
            "TIDEMARK_CATALOG_URI, TIDEMARK_WAREHOUSE), or, only if the sinks are gone for good, "
            "`tidemark unregister --unfenced` (unregister_job(..., allow_unfenced=True))")
        self.plan = plan
