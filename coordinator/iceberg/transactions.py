"""One atomic commit across tables: the Iceberg REST spec's ``POST /v1/{prefix}/transactions/commit``.

    if supports_multi_table_commit(catalog):
        commit_tables(catalog, [TableChange(table, requirements, updates), ...])   # all land, or none

pyiceberg 0.12 commits one table at a time; the REST spec has had a multi-table transaction since 1.4, which
Iceberg's own REST server, Nessie, Polaris and Lakekeeper implement and advertise in their configuration's
``endpoints``. A catalog that does not advertise it (SeaweedFS's, any non-REST catalog) gets one commit per table
from the caller (``publish.publish_together``). The request is pyiceberg's own models (``CommitTableRequest``, one
per table) in the spec's envelope, sent on the catalog's session, so its authentication applies.

Failure behaviour: as ``RestCatalog.commit_table``: 409 is ``CommitFailedException`` (a requirement of some
table failed: nothing landed), 500, 502 and 504 ``CommitStateUnknownException`` (it may have landed, for every
table or, on a catalog that is not atomic, some), other answers pyiceberg's errors for them (a 400 is
``BadRequestError``). The server answers no metadata: the caller loads each table again.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import Endpoint, HttpMethod, RestCatalog
from pyiceberg.catalog.rest.response import _handle_non_200_response
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import CommitTableRequest, Table, TableIdentifier
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import UTF8, IcebergBaseModel
from requests import HTTPError

TRANSACTIONS_COMMIT = "transactions/commit"
_ENDPOINT = Endpoint(http_method=HttpMethod.POST, path=f"/v1/{{prefix}}/{TRANSACTIONS_COMMIT}")


class CommitTransactionRequest(IcebergBaseModel):
    """The spec's ``CommitTransactionRequest``: each table's requirements and updates."""

    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


@dataclass(frozen=True)
class TableChange:
    """One table's part of a multi-table commit."""

    table: Table
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]


def supports_multi_table_commit(catalog: Catalog) -> bool:
    """Whether ``catalog`` is a REST catalog whose configuration advertises ``POST .../transactions/commit``."""
    # pyiceberg keeps the advertised endpoints on the catalog (its own check, ``_check_endpoint``, is private too).
    return isinstance(catalog, RestCatalog) and _ENDPOINT in getattr(catalog, "_supported_endpoints", ())


def commit_tables(catalog: RestCatalog, changes: Sequence[TableChange]) -> None:
    """Commit every table's change in one request, atomically on a catalog that supports it.

    :raises CommitFailedException: a requirement failed (409): nothing landed.
    :raises CommitStateUnknownException: the server failed (500, 502, 504): it may have landed.
    :raises pyiceberg.exceptions.RESTError: any other answer, as pyiceberg maps it (400: ``BadRequestError``).
    """
    request = CommitTransactionRequest(**{"table-changes": [
        CommitTableRequest(identifier=TableIdentifier(namespace=c.table.name()[:-1], name=c.table.name()[-1]),
                           requirements=c.requirements, updates=c.updates) for c in changes]})
    # The catalog's session carries its authentication (a bearer token, SigV4); pyiceberg has no public handle on it.
    response = catalog._session.post(catalog.url(TRANSACTIONS_COMMIT, prefixed=True),
                                     data=request.model_dump_json(by_alias=True).encode(UTF8))
    try:
        response.raise_for_status()
    except HTTPError as exc:
        _handle_non_200_response(exc, {409: CommitFailedException, 500: CommitStateUnknownException,
                                       502: CommitStateUnknownException, 504: CommitStateUnknownException})


__all__ = ["CommitTransactionRequest", "TableChange", "commit_tables", "supports_multi_table_commit"]
