"""The staging tests (``tests/test_staging.py``) on SeaweedFS's REST catalog and S3 store, the lakehouse's: a
write staged with no catalog commit, published in one, built again when another snapshot took its sequence number,
and refused when ``main`` moved, on a REST catalog that answers in its own words (``tests/test_iceberg_rest_catalog.py``
runs them on Iceberg's own REST server)."""
from __future__ import annotations

import pytest

from coordinator.iceberg.transactions import supports_multi_table_commit
from tests import test_staging as staging
from tests.test_iceberg_rest_catalog import STAGING_TESTS
from tests.test_lakehouse import lakehouse  # noqa: F401 - the module's own server (a module-scoped fixture)


@pytest.fixture
def catalog_settings(lakehouse):  # noqa: F811 - the fixture imported above
    return lakehouse.catalog_settings()


globals().update({name: getattr(staging, name) for name in STAGING_TESTS})


def test_this_catalog_has_no_multi_table_commits_so_each_sink_is_published_on_its_own(catalog_settings):
    """SeaweedFS's catalog advertises no ``transactions/commit``: a writer publishes its sinks one commit each
    (``tests/test_lakehouse.py``'s cascade does, on it)."""
    assert not supports_multi_table_commit(catalog_settings.load())
