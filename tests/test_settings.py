"""One settings object reads the environment; the documentation's table lists exactly its variables."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator import ConfigurationError, Tidemark
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.settings import VARIABLES, Settings
from coordinator.zookeeper.security import TlsSettings
from tests.helpers.docs import page

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_table_lists_exactly_the_variables_the_settings_read():
    components = page("components.md")
    table = components[components.index("| variable | what it does | default |"):]
    table = table[:table.index("\n\n")]
    assert re.findall(r"^\| `(TIDEMARK_[A-Z_]+)` \|", table, re.M) == list(VARIABLES)


def test_no_module_reads_the_environment_but_the_settings():
    readers = []
    for path in [*ROOT.glob("coordinator/**/*.py"), *ROOT.glob("spark_hooks/**/*.py")]:
        for match in re.finditer(r"os\.environ(?:\.get)?\s*[\[(]\s*[\"'](TIDEMARK_\w+)", path.read_text()):
            readers.append(f"{path.relative_to(ROOT)}: {match.group(1)}")
    assert readers == []
    source = (ROOT / "coordinator" / "settings.py").read_text()
    assert all(f'"{name}"' in source.split("class Settings")[1] for name in VARIABLES), \
        "every documented variable is read in Settings.from_env"


def test_settings_read_every_variable_and_defaults_without_them(tmp_path):
    assert Settings.from_env({}) == Settings.from_env({"TIDEMARK_ZK": " "})
    defaults = Settings.from_env({"XDG_DATA_HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert defaults.zk_connect == "127.0.0.1:2181" and defaults.catalog_name == "lake"
    assert defaults.home == tmp_path / "tidemark" and defaults.cache == tmp_path / "c" / "tidemark"
    assert defaults.metrics_port is None and not defaults.tls_enabled and defaults.spark_jars == ()
    given = Settings.from_env({
        "TIDEMARK_ZK": "zk1:2181/t", "TIDEMARK_ZK_USER": "w", "TIDEMARK_ZK_PASSWORD": "pw",
        "TIDEMARK_ZK_TLS_CA": str(tmp_path / "ca.pem"), "TIDEMARK_ZK_TLS_VERIFY": "no",
        "TIDEMARK_CATALOG_NAME": "prod", "TIDEMARK_CATALOG_URI": "postgresql://u@db/c", "TIDEMARK_HOME": str(tmp_path),
        "TIDEMARK_SPARK_JARS": "a.jar, b.jar,", "TIDEMARK_SPARK_MASTER": "k8s://x", "TIDEMARK_METRICS_PORT": "9465",
    })
    assert (given.zk_connect, given.zk_user, given.zk_password) == ("zk1:2181/t", "w", "pw")
    assert given.tls_enabled and not given.zk_tls_verify
    assert given.spark_jars == ("a.jar", "b.jar") and given.spark_master == "k8s://x" and given.metrics_port == 9465
    catalog = CatalogSettings.from_env(given)
    assert (catalog.name, catalog.uri, catalog.warehouse) == ("prod", "postgresql://u@db/c",
                                                              f"file://{tmp_path / 'warehouse'}")
    assert TlsSettings.from_env(Settings.from_env({"TIDEMARK_ZK_TLS": "0", "TIDEMARK_ZK_TLS_CA": "x"})) is None


@pytest.mark.parametrize(("name", "value"), [("TIDEMARK_METRICS_PORT", "http"), ("TIDEMARK_METRICS_PORT", "70000"),
                                             ("TIDEMARK_ZK_TLS", "maybe"), ("TIDEMARK_ZK_TLS_VERIFY", "2")])
def test_an_unusable_value_is_an_error_naming_the_variable(name, value, monkeypatch):
    with pytest.raises(ConfigurationError, match=name):
        Settings.from_env({name: value})
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=name):  # before any connection is tried
        Tidemark.connect("127.0.0.1:1", connect_timeout=1)
