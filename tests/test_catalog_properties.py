"""A catalog configured once: TIDEMARK_CATALOG_URI, pyiceberg's own configuration, and Spark's properties derived
from either (pure logic: nothing connects here; the REST and S3 servers' tests are in test_lakehouse.py)."""
from __future__ import annotations

import re

import pytest

from coordinator import CatalogSettings, ConfigurationError
from coordinator.iceberg.catalog import is_catalog_outage
from coordinator.iceberg.catalog_properties import S3_FILE_IO, java_properties, pyiceberg_properties
from coordinator.settings import Settings

REST = {"type": "rest", "uri": "http://127.0.0.1:8181", "warehouse": "lakehouse", "credential": "id:secret",
        "s3.endpoint": "http://127.0.0.1:8333", "s3.access-key-id": "key", "s3.secret-access-key": "secret",
        "s3.region": "us-east-1", "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}


@pytest.fixture
def no_pyiceberg_config(monkeypatch, tmp_path):
    """No .pyiceberg.yaml and no PYICEBERG_* variable, whatever the machine has."""
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for variable in [v for v in __import__("os").environ if v.upper().startswith("PYICEBERG_CATALOG")]:
        monkeypatch.delenv(variable)
    return tmp_path


def test_spark_gets_pyicebergs_rest_and_s3_settings_under_javas_names():
    java = java_properties(REST)
    assert java == {"type": "rest", "uri": "http://127.0.0.1:8181", "warehouse": "lakehouse",
                    "credential": "id:secret", "s3.endpoint": "http://127.0.0.1:8333", "s3.access-key-id": "key",
                    "s3.secret-access-key": "secret", "client.region": "us-east-1", "io-impl": S3_FILE_IO,
                    "s3.path-style-access": "true"}


def test_buckets_are_addressed_the_same_way_from_python_and_java():
    assert java_properties({**REST, "s3.force-virtual-addressing": "true"})["s3.path-style-access"] == "false"
    assert java_properties({**REST, "s3.path-style-access": "false"})["s3.path-style-access"] == "false"
    assert "s3.path-style-access" not in java_properties({"type": "rest", "uri": "http://c", "s3.region": "eu"})
    assert java_properties({"type": "glue", "warehouse": "s3://bucket/wh"})["io-impl"] == S3_FILE_IO
    assert java_properties({**REST, "io-impl": "my.FileIO"})["io-impl"] == "my.FileIO"
    assert "io-impl" not in java_properties({"type": "rest", "uri": "http://c", "warehouse": "file:///w"})


@pytest.mark.parametrize("kind", ["sql", "in-memory", "dynamodb"])
def test_a_catalog_type_spark_cannot_be_given_says_what_to_do(kind):
    with pytest.raises(ConfigurationError, match=r"TIDEMARK_CATALOG_URI.*CatalogSettings\.custom") as err:
        java_properties({"type": kind, "uri": "x"})
    assert "\n" not in str(err.value)


def test_pyicebergs_variables_configure_the_catalog_for_python_and_spark(no_pyiceberg_config, monkeypatch):
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", "http://127.0.0.1:8181/catalog")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__S3__ENDPOINT", "http://127.0.0.1:8333")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID", "key")
    settings = CatalogSettings.from_env(Settings.from_env({}))
    assert settings.python_catalog_properties() == {"uri": "http://127.0.0.1:8181/catalog",
                                                    "s3.endpoint": "http://127.0.0.1:8333",
                                                    "s3.access-key-id": "key"}
    conf = settings.spark_conf()
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.uri"] == "http://127.0.0.1:8181/catalog"
    assert conf["spark.sql.catalog.lake.io-impl"] == S3_FILE_IO
    assert conf["spark.sql.catalog.lake.cache-enabled"] == "false"
    assert settings.describe() == "catalog 'lake' at http://127.0.0.1:8181/catalog"


def test_a_pyiceberg_yaml_file_configures_the_named_catalog(no_pyiceberg_config):
    (no_pyiceberg_config / ".pyiceberg.yaml").write_text(
        "catalog:\n  other:\n    uri: http://elsewhere\n  Lake:\n    uri: https://rest.example:8443/api\n"
        "    warehouse: s3://bucket/warehouse\n    s3.region: eu-west-1\n")
    settings = CatalogSettings.from_env(Settings.from_env({}))
    assert settings.python_catalog_properties()["uri"] == "https://rest.example:8443/api"
    assert pyiceberg_properties("other") == {"uri": "http://elsewhere"}
    conf = settings.spark_conf()
    assert conf["spark.sql.catalog.lake.warehouse"] == "s3://bucket/warehouse"
    assert conf["spark.sql.catalog.lake.client.region"] == "eu-west-1"
    overridden = CatalogSettings.from_env(Settings.from_env({"TIDEMARK_WAREHOUSE": "s3://other/wh"}))
    assert overridden.spark_conf()["spark.sql.catalog.lake.warehouse"] == "s3://other/wh"


def test_a_rest_uri_in_tidemark_catalog_uri_keeps_pyicebergs_other_settings(no_pyiceberg_config, monkeypatch):
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", "http://ignored:1")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__CREDENTIAL", "client:secret")
    settings = CatalogSettings.from_env(Settings.from_env({"TIDEMARK_CATALOG_URI": "http://127.0.0.1:8181"}))
    assert settings.python_catalog_properties() == {"type": "rest", "uri": "http://127.0.0.1:8181",
                                                    "credential": "client:secret"}
    assert settings.spark_conf()["spark.sql.catalog.lake.credential"] == "client:secret"


def test_a_sql_catalog_with_its_files_on_s3_gives_spark_s3fileio(no_pyiceberg_config, monkeypatch, tmp_path):
    (tmp_path / "catalog.db").touch()
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__S3__ENDPOINT", "http://127.0.0.1:8333")
    settings = CatalogSettings.from_env(Settings.from_env({"TIDEMARK_CATALOG_URI": f"sqlite:///{tmp_path}/catalog.db",
                                                           "TIDEMARK_WAREHOUSE": "s3://bucket/wh"}))
    python = settings.python_catalog_properties()
    assert python["type"] == "sql" and python["s3.endpoint"] == "http://127.0.0.1:8333"
    conf = settings.spark_conf()
    assert conf["spark.sql.catalog.lake.catalog-impl"] == "org.apache.iceberg.jdbc.JdbcCatalog"
    assert conf["spark.sql.catalog.lake.io-impl"] == S3_FILE_IO
    assert conf["spark.sql.catalog.lake.s3.path-style-access"] == "true"


def test_s3_settings_give_no_s3fileio_to_a_catalog_whose_files_are_elsewhere(no_pyiceberg_config, monkeypatch,
                                                                           tmp_path):
    (tmp_path / "catalog.db").touch()
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__S3__ENDPOINT", "http://127.0.0.1:8333")
    settings = CatalogSettings.from_env(Settings.from_env({"TIDEMARK_CATALOG_URI": f"sqlite:///{tmp_path}/catalog.db",
                                                           "TIDEMARK_WAREHOUSE": f"file://{tmp_path}/wh"}))
    assert "spark.sql.catalog.lake.io-impl" not in settings.spark_conf()
    assert "io-impl" not in java_properties({"type": "rest", "uri": "http://c", "warehouse": "gs://b/w",
                                             "s3.endpoint": "http://x"})


def test_without_any_configuration_it_is_the_embedded_catalog(no_pyiceberg_config):
    settings = CatalogSettings.from_env(Settings.from_env({"TIDEMARK_HOME": str(no_pyiceberg_config)}))
    assert settings.uri == f"sqlite:///{no_pyiceberg_config}/catalog.db" and not settings.create_if_missing


def test_a_malformed_pyiceberg_yaml_is_one_clear_line(no_pyiceberg_config):
    (no_pyiceberg_config / ".pyiceberg.yaml").write_text("catalog: [unclosed\n")
    with pytest.raises(ConfigurationError, match="pyiceberg's configuration cannot be read") as err:
        CatalogSettings.from_env(Settings.from_env({}))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("uri", ["http://", "https:///path"])
def test_a_rest_uri_without_a_host_is_refused(uri):
    with pytest.raises(ConfigurationError, match="needs a host"):
        CatalogSettings(uri=uri)


def test_the_type_is_inferred_from_the_uri_as_pyiceberg_does():
    assert java_properties({"uri": "thrift://metastore:9083"})["type"] == "hive"
    assert java_properties({"uri": "https://rest"})["type"] == "rest"
    with pytest.raises(ConfigurationError, match="TIDEMARK_CATALOG_URI"):
        java_properties({"uri": "postgresql+psycopg2://u@h/db"})


def test_pyicebergs_client_properties_reach_java_and_its_s3_ones_win_as_in_pyiceberg():
    java = java_properties({"type": "rest", "uri": "http://c", "client.access-key-id": "shared",
                            "client.secret-access-key": "s", "client.region": "eu-west-1"})
    assert (java["s3.access-key-id"], java["s3.secret-access-key"]) == ("shared", "s")
    assert java["client.region"] == "eu-west-1"
    assert java["io-impl"] == S3_FILE_IO and "client.access-key-id" not in java
    both = java_properties({"type": "rest", "uri": "http://c", "client.access-key-id": "shared",
                            "s3.access-key-id": "s3-own", "client.region": "eu-west-1", "s3.region": "us-east-2"})
    assert (both["s3.access-key-id"], both["client.region"]) == ("s3-own", "us-east-2")


def test_a_sql_catalog_in_pyicebergs_configuration_is_opened_as_tidemarks_own(no_pyiceberg_config, monkeypatch):
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", "postgresql+psycopg2://tidemark:pw@db:5432/lake")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", "s3://bucket/wh")
    settings = CatalogSettings.from_env(Settings.from_env({}))
    assert settings.uri == "postgresql://tidemark:pw@db:5432/lake" and settings.warehouse == "s3://bucket/wh"
    python = settings.python_catalog_properties()
    assert python["type"] == "sql" and "lock_timeout" in python["uri"]  # the session settings of issue 22
    assert settings.spark_conf()["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://db:5432/lake"
    assert "pw" not in repr(settings) and "pw" not in settings.describe()


@pytest.mark.parametrize(("error", "outage"), [
    (OSError("When reading information for key 'a' in bucket 'b': AWS Error NETWORK_CONNECTION during "
             "HeadObject operation: curlCode: 7, Couldn't connect to server"), True),
    (OSError("When uploading part for key 'a': AWS Error SLOW_DOWN during UploadPart operation"), True),
    (OSError("When listing objects under key 'a': AWS Error UNKNOWN (HTTP status 503) during ListObjectsV2"), True),
    (OSError("When reading information for key 'a' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject"), False),
    (OSError("When creating key 'a' in bucket 'nope': AWS Error NO_SUCH_BUCKET during PutObject"), False),
    (OSError("[Errno 28] No space left on device"), False),
])
def test_only_transient_object_store_errors_are_outages(error, outage):
    assert is_catalog_outage(error) is outage


def test_rest_catalog_errors_that_pass_are_outages_and_mistakes_are_not():
    from pyiceberg.exceptions import (
        CommitFailedException,
        CommitStateUnknownException,
        ServerError,
        TooManyRequestsError,
        UnauthorizedError,
    )
    from requests.exceptions import ConnectionError as RequestConnectionError
    from requests.exceptions import ReadTimeout, SSLError
    for transient in (RequestConnectionError("refused"), ReadTimeout("slow"), ServerError("502"),
                      TooManyRequestsError("429"), CommitStateUnknownException("504")):
        assert is_catalog_outage(transient), transient
    for mistake in (SSLError("certificate verify failed"), UnauthorizedError("401"), CommitFailedException("409")):
        assert not is_catalog_outage(mistake), mistake


def test_spark_hides_a_rest_catalogs_client_secret():
    from spark_hooks.session import spark_conf
    settings = CatalogSettings(name="lake", python_properties={"type": "rest", "uri": "http://c",
                                                               "credential": "id:secret"})
    conf = spark_conf(settings, jars=[])
    assert re.search(conf["spark.redaction.regex"], "spark.sql.catalog.lake.credential")
