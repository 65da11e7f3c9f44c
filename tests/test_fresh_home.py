"""Nothing that reads or operates creates a catalog (issue 28): in a new home, with no catalog named, every
``tidemark`` command that needs the catalog fails in one line naming the catalog it looked for, as do the
readers, the garbage collector and a writer, and the home is left as it was found (empty). Real ZooKeeper,
real SQLite: only ``CatalogSettings.embedded()`` creates the embedded catalog."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordinator import CatalogSettings, ConfigurationError, EpochWriter, GarbageCollector, VersionReader
from tests.helpers.cli import assert_one_line_error, run_cli

CATALOG_VARIABLES = ("TIDEMARK_CATALOG_URI", "TIDEMARK_CATALOG_NAME", "TIDEMARK_WAREHOUSE")


@dataclass(frozen=True)
class NewHome:
    """Directories a user's first command meets empty, and the embedded catalog's database it looks for."""

    directories: tuple[Path, ...]
    database: Path

    @property
    def missing(self) -> str:
        """What the error says: which catalog it looked for, and that it does not exist."""
        return f"catalog 'lake' at sqlite:///{self.database} does not exist"

    def assert_untouched(self) -> None:
        for directory in self.directories:
            assert list(directory.iterdir()) == [], f"{directory} was changed: {list(directory.rglob('*'))}"


@pytest.fixture(params=["tidemark-home", "default-home"])
def new_home(request, tmp_path, monkeypatch) -> NewHome:
    """No catalog named, and an empty home: ``TIDEMARK_HOME`` an empty directory, or unset with an empty
    ``HOME``, so the default location ``~/.local/share/tidemark`` (which does not exist yet) is used."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in (*CATALOG_VARIABLES, "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "default-home":
        monkeypatch.delenv("TIDEMARK_HOME", raising=False)
        return NewHome((home,), home / ".local" / "share" / "tidemark" / "catalog.db")
    tidemark_home = tmp_path / "tidemark"
    tidemark_home.mkdir()
    monkeypatch.setenv("TIDEMARK_HOME", str(tidemark_home))
    return NewHome((home, tidemark_home), tidemark_home / "catalog.db")


@pytest.fixture
def registered(tm) -> str:
    """A deployment with job ``counts`` (db.words -> db.counts) registered and no leader: every command below
    needs the catalog to check or read the job's tables."""
    tm.register_job("counts", sources=["db.words"], sinks=["db.counts"])
    return "counts"


@pytest.mark.parametrize("command", [
    ["resolve", "db.counts"],
    ["resolve", "--no-zk", "db.counts"],
    ["unregister", "counts", "--yes"],
    ["versions"],
    ["gc", "--dry-run"],
], ids=" ".join)
def test_a_command_in_a_new_home_names_the_missing_catalog_and_creates_nothing(command, new_home, registered, tm,
                                                                               zk_connect, capsys):
    code, out, err = run_cli(capsys, "--zk", zk_connect, *command)
    assert_one_line_error(code, err, new_home.missing, "TIDEMARK_HOME", "TIDEMARK_CATALOG_URI",
                          "CatalogSettings.embedded()")
    assert out == ""
    new_home.assert_untouched()
    assert registered in tm.topology().jobs, "the job was unregistered without its sinks fenced"


def test_resolve_in_an_empty_deployment_names_the_missing_catalog(new_home, zk_connect, capsys):
    code, _, err = run_cli(capsys, "--zk", zk_connect, "resolve", "db.t")
    assert_one_line_error(code, err, new_home.missing)
    assert "registered in ZooKeeper" not in err
    new_home.assert_untouched()


def test_commands_that_do_not_need_the_catalog_still_answer(new_home, registered, zk_connect, capsys):
    for command in (["status"], ["topology"]):
        code, out, err = run_cli(capsys, "--zk", zk_connect, *command)
        assert code == 0 and "counts" in out and err == "", (command, err)
    new_home.assert_untouched()


def test_readers_the_collector_and_a_writer_given_no_catalog_create_none(new_home, registered, tm):
    for make in (lambda: VersionReader.resolve(["db.counts"], tm), lambda: GarbageCollector(tm),
                 lambda: EpochWriter(tm, "counts", sources=["db.words"], sinks=["db.counts"]),
                 lambda: CatalogSettings.from_env().spark_conf()):
        with pytest.raises(ConfigurationError, match=re.escape(new_home.missing)):
            make()
    new_home.assert_untouched()


def test_only_the_embedded_catalog_asked_for_is_created(new_home, caplog):
    def announced() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "coordinator.iceberg.catalog"]
    catalog = CatalogSettings.embedded().load()
    assert new_home.database.is_file()
    assert announced() == [
        f"created a new, empty Iceberg catalog 'lake' at {new_home.database}: set TIDEMARK_HOME if your tables "
        "live elsewhere"]
    catalog.create_namespace("db")
    assert CatalogSettings.from_env().load().list_namespaces() == [("db",)]  # the same catalog, not created again
    assert len(announced()) == 1
