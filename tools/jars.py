"""Download Iceberg's Spark jars, and the servers the tests read with, from Maven Central into the cache
(``make setup`` runs this; not in the wheel).

    python -m tools.jars install         # what a Spark driver needs (the Docker image runs this too)
    python -m tools.jars test-servers    # Trino and Iceberg's REST catalog server, for the tests

For the installed pyspark it fetches what ``spark_hooks.classpath`` puts on a session's class path:
Iceberg's Spark runtime for that Spark and Scala, ``iceberg-aws-bundle`` of the same Iceberg release, and
the SQLite and PostgreSQL JDBC drivers. Each is checked against the SHA-1 Maven Central publishes beside
it and kept in ``<cache>/maven`` (``TIDEMARK_CACHE``) in a Maven repository's layout; a jar already there
is not fetched again. ``MAVEN_REPOSITORY`` names a mirror instead of Maven Central.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Optional

from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from coordinator.errors import ConfigurationError
from coordinator.settings import Settings
from spark_hooks.classpath import JDBC_DRIVERS, MAVEN_CENTRAL, IcebergRuntime, MavenArtifact, cached_jar

REQUEST_TIMEOUT_S = 60
DOWNLOAD_DEADLINE_S = 300  # per jar, all attempts included
PROGRESS_EVERY_S = 5.0  # a download's progress line, when stdout is not a terminal

# The servers of the tests that read and write the lakehouse as software that knows nothing of Tidemark:
# Iceberg's own REST catalog server (the second REST implementation, backed by PostgreSQL) and Trino, its core
# tarball and Iceberg plugin (the full tarball is 800 MB of other connectors). Trino 476 is the newest whose
# core tarball Maven Central serves; it runs on Java 24 or later (tests/helpers/trino.py finds one).
ICEBERG_REST_SERVER = MavenArtifact("org.apache.iceberg", "iceberg-open-api", "1.10.0")
TRINO_VERSION = "476"
TRINO_SERVER = MavenArtifact("io.trino", "trino-server-core", TRINO_VERSION, packaging="tar.gz")
TRINO_ICEBERG_PLUGIN = MavenArtifact("io.trino", "trino-iceberg", TRINO_VERSION, packaging="zip")
TEST_SERVERS = (ICEBERG_REST_SERVER, TRINO_SERVER, TRINO_ICEBERG_PLUGIN, JDBC_DRIVERS["postgresql"])


def trino_home(settings: Settings) -> Path:
    """Where ``test-servers`` unpacks Trino with its Iceberg plugin (the tests only read it)."""
    return settings.cache / "trino" / TRINO_VERSION


def repository_url() -> str:
    """``MAVEN_REPOSITORY`` (a mirror), else Maven Central."""
    return (os.environ.get("MAVEN_REPOSITORY") or MAVEN_CENTRAL).rstrip("/")


def install(settings: Optional[Settings] = None) -> list[Path]:
    """Every jar the installed Spark needs, in the cache (idempotent); returns their paths."""
    return fetch((*IcebergRuntime.installed().artifacts(), *JDBC_DRIVERS.values()), settings)


def install_test_servers(settings: Optional[Settings] = None) -> list[Path]:
    """The test servers in the cache, and Trino unpacked with its Iceberg plugin (idempotent)."""
    settings = settings or Settings.from_env()
    paths = fetch(TEST_SERVERS, settings)
    home = trino_home(settings)
    if not home.is_dir():
        # Unpacked beside its final place and renamed, so a half-unpacked server is never taken for a whole one.
        with tempfile.TemporaryDirectory(dir=home.parent.parent) as scratch:
            with tarfile.open(cached_jar(settings, TRINO_SERVER)) as archive:
                # The "data" filter refuses links and paths out of the directory; a Python without it (Debian 12's
                # 3.11.2 predates 3.11.4's backport) unpacks Maven Central's archive as it is.
                if hasattr(tarfile, "data_filter"):
                    archive.extractall(scratch, filter="data")
                else:
                    archive.extractall(scratch)  # Maven Central's archive of a pinned release
            server = Path(scratch) / f"trino-server-core-{TRINO_VERSION}"
            with zipfile.ZipFile(cached_jar(settings, TRINO_ICEBERG_PLUGIN)) as archive:
                archive.extractall(scratch)
            (Path(scratch) / f"trino-iceberg-{TRINO_VERSION}").rename(server / "plugin" / "iceberg")
            home.parent.mkdir(parents=True, exist_ok=True)
            server.rename(home)
    return [*paths, home]


def fetch(artifacts: tuple[MavenArtifact, ...], settings: Optional[Settings] = None) -> list[Path]:
    """``artifacts`` in the cache, each downloaded once and checked (idempotent); returns their paths."""
    settings = settings or Settings.from_env()
    repository = repository_url()
    paths = []
    for artifact in artifacts:
        target = cached_jar(settings, artifact)
        if not target.is_file():
            _download(artifact, f"{repository}/{artifact.path}", target)
        paths.append(target)
    return paths


class Progress:
    """A download's size and progress on stdout: on a terminal one line rewritten as it goes, otherwise (a CI log)
    a line every ``PROGRESS_EVERY_S`` seconds."""

    def __init__(self, what: str, size: int) -> None:
        self.what, self.size, self.done = what, size, 0
        self.terminal = sys.stdout.isatty()
        self.said = time.monotonic()
        print(f"jars: downloading {what} ({_megabytes(size) if size else 'size unknown'})", flush=True)

    def advance(self, length: int) -> None:
        self.done += length
        if self.terminal:
            print(f"\r  {self._so_far()}", end="", flush=True)
        elif time.monotonic() - self.said >= PROGRESS_EVERY_S:
            self.said = time.monotonic()
            print(f"jars: {self.what}: {self._so_far()}", flush=True)

    def finish(self) -> None:
        if self.terminal:
            print(flush=True)

    def _so_far(self) -> str:
        if not self.size:
            return f"{_megabytes(self.done)} so far"
        return f"{_megabytes(self.done)} of {_megabytes(self.size)} ({100 * self.done // self.size}%)"


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _transient(exc: BaseException) -> bool:
    """A network failure or a server error is worth another try; a 404 or 403 is not."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500
    return isinstance(exc, (urllib.error.URLError, TimeoutError, ConnectionError))


@retry(retry=retry_if_exception(_transient),
       stop=stop_after_delay(DOWNLOAD_DEADLINE_S), wait=wait_exponential(multiplier=1, max=20), reraise=True)
def _download(artifact: MavenArtifact, url: str, target: Path) -> None:
    with urllib.request.urlopen(f"{url}.sha1", timeout=REQUEST_TIMEOUT_S) as response:
        published = response.read().decode(errors="replace").split()
    if not published:
        raise ConfigurationError(f"{url}.sha1 is empty: the repository publishes no checksum to check the jar against")
    expected = published[0].lower()
    target.parent.mkdir(parents=True, exist_ok=True)
    # A file of this download's own (two set-ups at once share the JDBC drivers): only a checked file is renamed.
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as out:
        partial = Path(out.name)
        digest = hashlib.sha1(usedforsecurity=False)
        try:
            with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
                progress = Progress(artifact.coordinate, int(response.headers.get("Content-Length") or 0))
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    progress.advance(len(chunk))
                progress.finish()
        except BaseException:
            partial.unlink()  # a download cut short is never left behind, whether it is tried again or not
            raise
    if digest.hexdigest() != expected:
        partial.unlink()
        raise ConfigurationError(f"{url} does not match its published SHA-1 ({digest.hexdigest()} != {expected}): "
                                 "run `make setup` again; if it persists, your repository or proxy serves a "
                                 "different file")
    os.replace(partial, target)


def main(argv: list[str]) -> int:
    actions = {"install": install, "test-servers": install_test_servers}
    if len(argv) != 2 or argv[1] not in actions:
        print("usage: python -m tools.jars install|test-servers", file=sys.stderr)
        return 2
    try:
        paths = actions[argv[1]]()
    except ConfigurationError as exc:
        print(f"jars: error: {exc}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        print(f"jars: error: cannot download from {repository_url()} ({exc}): check the network, or set "
              "MAVEN_REPOSITORY to a mirror or TIDEMARK_SPARK_JARS to jars you have", file=sys.stderr)
        return 1
    print(f"jars: ready ({len(paths)} files in {Settings.from_env().cache / 'maven'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
