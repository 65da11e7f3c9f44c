"""README.md's quickstart and docs/lakehouse-quickstart.md's, run as written, so they cannot rot; and a job whose
tables are missing registers nothing.

The quickstart's shell blocks run in order as one bash script (``set -euo pipefail``) and its Python block
is saved under the name its first line gives, as the README tells the reader to. Real ZooKeeper (``tidemark
zk start``, the default port 2181) and the real embedded SQLite catalog, in a fresh ``TIDEMARK_HOME``.
The script runs in a private network namespace (``unshare``), so the default port is the test's own and
never another ZooKeeper's on this machine. The install line runs for real, before the rest and outside that
namespace (it needs the package index): into a fresh venv, from a wheel of this checkout built by the test at the
path the line names; the rest of the quickstart then runs with that venv's python and ``tidemark``. The lakehouse
quickstart runs the first one's script with the lakehouse's settings (SeaweedFS, from the lakehouse extra).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from coordinator import EpochWriter
from coordinator.errors import TableNotFound
from coordinator.operations.lakehouse_server import EmbeddedLakehouse
from coordinator.operations.zookeeper_server import DEFAULT_PORT, EmbeddedZooKeeper
from tests.helpers.docs import page, section
from tests.helpers.wheel import build_wheel

ROOT = Path(__file__).resolve().parent.parent
README = page("README.md")
PYPROJECT = (ROOT / "pyproject.toml").read_text()
DEADLINE_S = 240
INSTALL_DEADLINE_S = 600  # a fresh venv: pyiceberg, pyarrow, pandas, polars, DuckDB
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def quickstart(title: str = "Quickstart") -> str:
    """README's quickstart, or the lakehouse one (a page of its own)."""
    if title == "Quickstart":
        return section(README, title)
    return page("lakehouse-quickstart.md")


def blocks(section: str) -> list[tuple[str, str]]:
    return [(language, body) for language, body in FENCE.findall(section)]


def install_line(section: str) -> str:
    shell = "\n".join(body for language, body in blocks(section) if language == "sh")
    (line,) = re.findall(r"^pip install .*$", shell, re.M)
    return line


def test_the_quickstart_is_one_screen_with_an_install_line_for_this_distribution():
    section = quickstart()
    assert len(section.splitlines()) <= 60, "the quickstart no longer fits on one screen"
    found = re.fullmatch(r"pip install '(dist/([\w.]+)-([\w.]+)-py3-none-any\.whl)\[([\w,]+)\]'(?:\s+#.*)?",
                         install_line(section))
    assert found, f"the quickstart installs {install_line(section)!r}, not a wheel built from a clone"
    name = re.search(r'^name = "([^"]+)"$', PYPROJECT, re.M)
    version = re.search(r'^version = "([^"]+)"$', PYPROJECT, re.M)
    assert name is not None and version is not None
    assert found.group(2) == name.group(1).replace("-", "_"), f"the quickstart installs {found.group(2)}"
    assert found.group(3) == version.group(1), f"the wheel's version {found.group(3)} is not {version.group(1)}"
    for extra in found.group(4).split(","):
        assert re.search(rf"^{extra} = \[", PYPROJECT, re.M), f"pyproject.toml has no extra {extra!r}"


def _namespaced() -> Optional[list[str]]:
    """The command prefix that runs the script with a network of its own (loopback only), or None."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        return None
    prefix = [unshare, "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    probe = subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    return prefix if probe.returncode == 0 else None


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("title", ["Quickstart", "Quickstart on the lakehouse"])
def test_the_readme_quickstart_runs_as_written(tmp_path, title):
    """Each quickstart in a new home: the lakehouse one runs the first one's script, saved as the reader saved it,
    with the catalog from the environment its `eval` set."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    section = quickstart(title)
    install = install_line(section)
    wheel_path = re.search(r"'(dist/[^\[']+)", install)
    assert wheel_path is not None
    wheel, _ = build_wheel(tmp_path / "build")
    (work / "dist").mkdir()
    shutil.copy(wheel, work / wheel_path.group(1))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    # --no-compile: byte-compiling pandas, polars and pyarrow takes half a minute and tells nothing.
    installed = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{install} --no-compile -q"], cwd=work,
                               env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                               capture_output=True, text=True, timeout=INSTALL_DEADLINE_S)
    assert installed.returncode == 0, f"the install line failed:\n{installed.stdout}{installed.stderr}"
    # the servers go with the script, whatever fails
    script = ["trap 'tidemark lakehouse stop >/dev/null 2>&1 || true; tidemark zk stop >/dev/null 2>&1 || true' EXIT"]
    for language, body in blocks(quickstart()) + blocks(section):
        if language == "python":
            name = re.match(r"# ([\w.-]+\.py)\b", body)
            assert name, "the quickstart's Python block must start with '# <file>.py' (the file the reader saves)"
            (work / name.group(1)).write_text(body)
    for language, body in blocks(section):
        if language == "sh":
            script += [line for line in body.splitlines() if line != install]
    (work / "quickstart.sh").write_text("\n".join(script) + "\n")

    # The quickstart's defaults, not this machine's settings (the ZooKeeper server's class path stays).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TIDEMARK_", "PYICEBERG_")) or k == "TIDEMARK_ZK_CLASSPATH"}
    env.update(TIDEMARK_HOME=str(home), HOME=str(tmp_path), PATH=f"{bin_dir}:{env['PATH']}")
    homes = [home, tmp_path / "tidemark-lakehouse"]  # the lakehouse section's own TIDEMARK_HOME
    prefix = _namespaced()
    if prefix is None and not _port_free(DEFAULT_PORT):
        pytest.fail(f"port {DEFAULT_PORT} is taken and this machine has no network namespaces (unshare): the "
                    "quickstart's `tidemark zk start` needs that port")
    command = ["bash", "-c", "ip link set lo up && exec bash -euo pipefail quickstart.sh"] if prefix else \
        ["bash", "-euo", "pipefail", "quickstart.sh"]
    process = subprocess.Popen([*(prefix or []), *command], cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the quickstart did not finish within {DEADLINE_S} s:\n{output}")
    finally:
        for each in homes:  # the script's trap failed: the test started them, end them
            server = EmbeddedZooKeeper(data_dir=each / "zookeeper").recorded_state()
            if server is not None and _alive(server.pid):
                os.kill(server.pid, signal.SIGKILL)
            EmbeddedLakehouse(each / "lakehouse").stop()
    assert process.returncode == 0, f"the quickstart failed (exit {process.returncode}):\n{output}"
    # pandas: the one big order above 2000; DuckDB: both big orders joined with their root rows.
    assert re.search(r"^\s*id\n0\s+3$", output, re.M), output
    assert "[(2, 4000)]" in output, output
    assert re.search(r"^stopped$", output, re.M), output
    if title == "Quickstart":
        statements = re.findall(r"^SELECT \* FROM lake\.db\.(\w+) FOR VERSION AS OF (\S+);$", output, re.M)
        assert sorted(t for t, _ in statements) == ["big_orders", "orders"], output
    else:  # the tables went to the lakehouse, not to an embedded catalog made on the side
        assert re.search(r"^export PYICEBERG_CATALOG__LAKE__URI=", output, re.M), output
        assert not (homes[1] / "catalog.db").exists() and not (home / "catalog.db").exists()
        assert (homes[1] / "lakehouse" / "weed.log").is_file()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_job_whose_sink_does_not_exist_fails_before_anything_is_registered(tm, catalog_settings, namespace):
    catalog = catalog_settings.load()
    catalog.create_namespace(namespace)
    writer = EpochWriter(tm, "orphan", sources=[f"{namespace}.orders"], sinks=[f"{namespace}.big_orders"],
                         catalog=catalog_settings, interval_ms=1000)
    # it says which catalog it looked in (a script that made its tables in another one reads this)
    where = re.escape(f"{namespace}.big_orders' does not exist in {catalog_settings.describe()}: create it there")
    with pytest.raises(TableNotFound, match=where):
        writer.run(lambda ctx: None, once=True)
    assert not tm.topology().jobs, "a job with a missing sink was registered"
    assert not tm.status().jobs
