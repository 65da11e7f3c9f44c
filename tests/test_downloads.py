"""``make setup``'s downloads (tools/jars.py) from a real HTTP server laid out as a Maven repository: each says its
size and its progress, is checked against its published SHA-1, and leaves nothing behind when it does not match."""
from __future__ import annotations

import functools
import hashlib
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coordinator.errors import ConfigurationError
from coordinator.settings import Settings
from spark_hooks.classpath import MavenArtifact, cached_jar
from tools import jars

ARTIFACT = MavenArtifact("org.example", "thing", "1.0")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the server's access log is not the download's output
        pass


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A Maven repository served over HTTP with a 3 MB ``ARTIFACT``; MAVEN_REPOSITORY and the cache point at it."""
    served = tmp_path / "repository"
    jar = served / ARTIFACT.path
    jar.parent.mkdir(parents=True)
    jar.write_bytes(bytes(range(256)) * (3 * 4096))
    jar.with_name(jar.name + ".sha1").write_text(hashlib.sha1(jar.read_bytes()).hexdigest() + "\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MAVEN_REPOSITORY", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("TIDEMARK_CACHE", str(tmp_path / "cache"))
    yield jar
    server.shutdown()
    server.server_close()


def test_a_download_says_its_size_and_progress_and_lands_checked(repository, monkeypatch, capsys):
    monkeypatch.setattr(jars, "PROGRESS_EVERY_S", 0.0)  # a line per chunk: the log of a CI run
    [path] = jars.fetch((ARTIFACT,), Settings.from_env())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "jars: downloading org.example:thing:1.0 (3.1 MB)", lines
    assert "jars: org.example:thing:1.0: 1.0 MB of 3.1 MB (33%)" in lines and \
        lines[-1] == "jars: org.example:thing:1.0: 3.1 MB of 3.1 MB (100%)", lines
    assert path == cached_jar(Settings.from_env(), ARTIFACT) and path.read_bytes() == repository.read_bytes()
    assert jars.fetch((ARTIFACT,), Settings.from_env()) == [path] and capsys.readouterr().out == "", \
        "a jar in the cache is not fetched again"


def test_a_download_that_does_not_match_its_sha1_is_refused_and_leaves_nothing(repository, capsys):
    repository.with_name(repository.name + ".sha1").write_text("0" * 40 + "\n")
    with pytest.raises(ConfigurationError, match="does not match its published SHA-1"):
        jars.fetch((ARTIFACT,), Settings.from_env())
    assert list(cached_jar(Settings.from_env(), ARTIFACT).parent.iterdir()) == []
