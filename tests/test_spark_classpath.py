"""Iceberg's jars for Spark: the runtime matching the installed pyspark, from the jars a user names, the cache
``make setup`` fills from Maven Central, or ``spark.jars.packages``; both ways a user gets them start Spark."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coordinator import CatalogSettings
from coordinator.errors import ConfigurationError
from coordinator.settings import Settings
from spark_hooks.classpath import (
    ICEBERG_RUNTIMES,
    JDBC_DRIVERS,
    IcebergRuntime,
    SparkClasspath,
    cached_jar,
    jdbc_drivers,
    spark_classpath,
)
from spark_hooks.session import spark_conf

ROOT = Path(__file__).resolve().parent.parent
SESSION_DEADLINE_S = 300


def test_each_supported_spark_gets_the_runtime_built_for_its_spark_and_scala():
    assert IcebergRuntime.for_spark("3.5.7").coordinates() == (
        f"org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:{ICEBERG_RUNTIMES['3.5'][1]}",
        f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_RUNTIMES['3.5'][1]}")
    assert IcebergRuntime.for_spark("4.1.4").coordinates()[0].startswith(
        "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:")
    assert IcebergRuntime.for_spark("4.0.1").scala_version == "2.13"


@pytest.mark.parametrize("version", ["4.2.1", "3.4.4", "4.3.0"])
def test_a_spark_without_an_official_iceberg_runtime_is_refused_by_name(version):
    with pytest.raises(ConfigurationError, match=rf"no Spark runtime for Spark {version}: install pyspark 3\.5"):
        IcebergRuntime.for_spark(version)


def test_the_extra_allows_exactly_the_sparks_that_have_a_runtime():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'spark = ["pyspark>=3.5,<4.2"]' in pyproject
    assert sorted(ICEBERG_RUNTIMES) == ["3.5", "4.0", "4.1"]


def test_each_sql_catalog_gets_its_jdbc_driver_once():
    found = jdbc_drivers(["jdbc:sqlite:/a.db?journal_mode=WAL", "jdbc:postgresql://h:5432/db", "jdbc:sqlite:/b.db",
                          "http://rest:8181/catalog"])
    assert found == (JDBC_DRIVERS["sqlite"], JDBC_DRIVERS["postgresql"])


def test_named_jars_win_and_must_exist(tmp_path):
    jar = tmp_path / "iceberg.jar"
    jar.write_bytes(b"jar")
    assert spark_classpath(Settings(spark_jars=(str(jar),))) == SparkClasspath(jars=(str(jar),))
    with pytest.raises(ConfigurationError, match=r"TIDEMARK_SPARK_JARS names jars that do not exist: .*missing\.jar"):
        spark_classpath(Settings(spark_jars=(str(tmp_path / "missing.jar"),)))


def test_cached_jars_go_on_the_class_path_and_without_them_spark_resolves_the_coordinates(tmp_path):
    settings = Settings(cache=tmp_path)
    uris = ["jdbc:sqlite:/x.db"]
    needed = (*IcebergRuntime.installed().artifacts(), JDBC_DRIVERS["sqlite"])
    packages = spark_classpath(settings, uris)
    assert packages == SparkClasspath(packages=tuple(a.coordinate for a in needed))
    assert packages.spark_conf() == {"spark.jars.packages": ",".join(a.coordinate for a in needed)}
    for artifact in needed[:-1]:  # one jar still missing: the cache is not used half
        cached_jar(settings, artifact).parent.mkdir(parents=True)
        cached_jar(settings, artifact).write_bytes(b"jar")
    assert spark_classpath(settings, uris).packages
    cached_jar(settings, needed[-1]).parent.mkdir(parents=True)
    cached_jar(settings, needed[-1]).write_bytes(b"jar")
    jars = spark_classpath(settings, uris)
    assert jars.jars == tuple(str(cached_jar(settings, a)) for a in needed)
    assert jars.spark_conf()["spark.executor.extraClassPath"] == ":".join(jars.jars)


def test_a_conf_that_brings_iceberg_itself_is_left_alone(tmp_path):
    catalog = CatalogSettings.embedded(tmp_path)
    mine = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.9.2"
    conf = spark_conf(catalog, extra_conf={"spark.jars.packages": mine})
    assert conf["spark.jars.packages"] == mine
    assert "spark.driver.extraClassPath" not in conf


def test_jars_and_packages_of_a_users_own_are_kept_beside_icebergs(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDEMARK_CACHE", str(tmp_path / "empty-cache"))  # nothing cached: packages
    monkeypatch.delenv("TIDEMARK_SPARK_JARS", raising=False)
    catalog = CatalogSettings.embedded(tmp_path)
    conf = spark_conf(catalog, extra_conf={"spark.jars.packages": "org.example:udf:1"})
    runtime = IcebergRuntime.installed()
    assert conf["spark.jars.packages"] == ",".join(
        (*runtime.coordinates(), JDBC_DRIVERS["sqlite"].coordinate, "org.example:udf:1"))
    jar = tmp_path / "iceberg.jar"
    jar.write_bytes(b"jar")
    monkeypatch.setenv("TIDEMARK_SPARK_JARS", str(jar))
    conf = spark_conf(catalog, extra_conf={"spark.executor.extraClassPath": "/opt/agent.jar"})
    assert conf["spark.executor.extraClassPath"] == f"{jar}:/opt/agent.jar"
    assert conf["spark.driver.extraClassPath"] == str(jar)


def _start_session(tmp_path: Path, env: dict[str, str]) -> str:
    """Start a SparkSession with ``build_spark_session`` in a process of its own, write and read an Iceberg table
    through the embedded SQLite catalog (its JDBC driver comes the same way), and return what it printed."""
    script = tmp_path / "session.py"
    script.write_text(textwrap.dedent(f"""
        from coordinator import CatalogSettings
        from spark_hooks.session import build_spark_session
        spark = build_spark_session(CatalogSettings.embedded({str(tmp_path / 'lake')!r}), extra_conf={{
            "spark.ui.enabled": "false", "spark.jars.ivy": {str(tmp_path / 'ivy')!r}}})
        print("packages:", spark.conf.get("spark.jars.packages", ""))
        spark.sql("CREATE NAMESPACE lake.db")
        spark.sql("CREATE TABLE lake.db.t (id bigint) USING iceberg")
        spark.sql("INSERT INTO lake.db.t VALUES (1), (2)")
        print("rows:", spark.table("lake.db.t").count())
        spark.stop()
    """))
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=SESSION_DEADLINE_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.mark.spark
def test_an_installed_package_with_no_local_jars_asks_spark_for_the_matching_packages(tmp_path):
    """A user who only pip-installed: nothing cached, nothing named; Spark downloads the runtime from Maven Central."""
    out = _start_session(tmp_path, {"TIDEMARK_CACHE": str(tmp_path / "empty-cache"), "TIDEMARK_SPARK_JARS": ""})
    runtime = IcebergRuntime.installed()
    assert f"packages: {','.join(runtime.coordinates())},{JDBC_DRIVERS['sqlite'].coordinate}\n" in out, out
    assert "rows: 2\n" in out, out
    assert any((tmp_path / "ivy" / "jars").glob(f"*iceberg-spark-runtime-{runtime.spark_version}_*.jar"))


@pytest.mark.spark
def test_the_jars_a_user_names_start_spark_without_packages(tmp_path):
    """TIDEMARK_SPARK_JARS naming the jars (here the ones make setup cached): no Ivy resolution at all."""
    settings = Settings.from_env()
    jars = [str(cached_jar(settings, a)) for a in (*IcebergRuntime.installed().artifacts(), JDBC_DRIVERS["sqlite"])]
    out = _start_session(tmp_path, {"TIDEMARK_CACHE": str(tmp_path / "empty-cache"),
                                    "TIDEMARK_SPARK_JARS": ",".join(jars)})
    assert "packages: \n" in out and "rows: 2\n" in out, out
    assert not (tmp_path / "ivy").exists()


def test_python_m_spark_hooks_conf_prints_the_sessions_settings_for_spark_submit_and_creates_nothing(tmp_path):
    """Under spark-submit the driver's JVM starts before the script: its jars and catalog come from the command line."""
    import shlex
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEMARK_CATALOG", "PYICEBERG_"))}
    env["TIDEMARK_HOME"] = str(home)

    def conf(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "spark_hooks", "conf", *args], env=env, capture_output=True,
                              text=True, timeout=120)
    properties = dict(line.split(" ", 1) for line in conf().stdout.splitlines())
    assert properties["spark.sql.catalog.lake.uri"].startswith("jdbc:sqlite:") and str(home) in \
        properties["spark.sql.catalog.lake.uri"]
    assert "iceberg-spark-runtime" in (properties.get("spark.driver.extraClassPath", "") +
                                       properties.get("spark.jars.packages", ""))
    words = shlex.split(conf("--format", "args").stdout)
    assert words[0::2] == ["--conf"] * (len(words) // 2)
    assert dict(w.split("=", 1) for w in words[1::2]) == properties
    assert not home.exists(), "printing the settings created the embedded catalog's directory"
    env["TIDEMARK_CATALOG_URI"] = "ftp://nowhere"
    failed = conf()
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("python -m spark_hooks: error: catalog URI 'ftp://nowhere'") and \
        failed.stderr.count("\n") == 1, failed.stderr
