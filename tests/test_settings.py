"""The settings object: every variable parsed in one place, bad values named, and the README's table in step."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator import ConfigurationError
from coordinator.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
# Read by a tool of the clone, not by the library: documented in the table, marked as such.
OUTSIDE_SETTINGS = {"TIDEMARK_CRASH_AT": "fault tests", "TIDEMARK_SKIP_APT": "make setup",
                    "TIDEMARK_BENCH_KEEP": "make bench"}


def _table_rows() -> dict[str, str]:
    text = README.read_text()
    start = text.index("| variable | default | what it does |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        names = re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1])
        assert len(names) == 1, f"one variable per row of the README's table: {line}"
        rows[names[0]] = line
    return rows


def test_the_readme_table_documents_exactly_the_settings_variables():
    rows = _table_rows()
    assert set(rows) == set(Settings.variables()) | set(OUTSIDE_SETTINGS)
    for name, tool in OUTSIDE_SETTINGS.items():
        assert f"for `{tool}` only" in rows[name] or f"for {tool} only" in rows[name], rows[name]


def test_defaults_from_an_empty_environment():
    settings = Settings.from_env({"HOME": "/home/u"})
    assert settings.zk_connect == "127.0.0.1:2181" and settings.catalog_name == "lake"
    assert settings.zk_user is None and settings.zk_tls is None and settings.zk_tls_verify
    assert settings.metrics_port is None and settings.metrics_address == "0.0.0.0"
    assert settings.spark_jars == () and settings.spark_master is None


def test_values_are_parsed():
    settings = Settings.from_env({"TIDEMARK_ZK": "zk1:2181/t", "TIDEMARK_METRICS_PORT": " 9465 ",
                                  "TIDEMARK_ZK_TLS": "yes", "TIDEMARK_ZK_TLS_VERIFY": "0",
                                  "TIDEMARK_SPARK_JARS": "/a.jar, /b.jar,", "TIDEMARK_HOME": "/data/tm",
                                  "XDG_CACHE_HOME": "/xdg", "TIDEMARK_CATALOG_NAME": ""})
    assert settings.zk_connect == "zk1:2181/t" and settings.metrics_port == 9465
    assert settings.zk_tls is True and settings.zk_tls_verify is False
    assert settings.spark_jars == ("/a.jar", "/b.jar")
    assert settings.home == Path("/data/tm") and settings.cache == Path("/xdg/tidemark")
    assert settings.catalog_name == "lake"  # empty counts as unset


@pytest.mark.parametrize(("name", "value"), [("TIDEMARK_METRICS_PORT", "http"), ("TIDEMARK_METRICS_PORT", "70000"),
                                             ("TIDEMARK_ZK_TLS", "maybe"), ("TIDEMARK_ZK_TLS_CHECK_HOSTNAME", "2")])
def test_an_unusable_value_names_its_variable(name, value):
    with pytest.raises(ConfigurationError, match=f"{name}='{value}'"):
        Settings.from_env({name: value})
