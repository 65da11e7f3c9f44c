"""The documentation's runs: every shell and Python block a reader is meant to run, run as written, so it cannot
rot; and a job whose tables are missing registers nothing.

A block says which run runs it (``<!-- run: spark -->`` on the line before it, ``tests/helpers/docs.py``). A run
(``RUNS``) reads its pages in a newcomer's order, in a new home with new empty ``HOME`` and ``TIDEMARK_HOME``:

- ``quickstart``: README's quickstart (real ZooKeeper, ``tidemark zk start`` on the default port 2181, the embedded
  SQLite catalog), then the pure-Python job page on its tables.
- ``lakehouse``: the lakehouse quickstart (SeaweedFS's S3 store and REST catalog, from the ``lakehouse`` extra)
  with README's script, read by Trino through ``tidemark serve`` (Trino's archives come from the suite's cache, a
  copy of Maven Central's: the run reads ``https://repo1.maven.org/maven2/`` as that cache, 540 MB each run
  spared), then the components page's lakehouse commands.
- ``newcomer``: the pages in the order the site lists them, in one home, as a person follows them: README's
  quickstart, the lakehouse quickstart, the Spark page, the pure-Python jobs, reading and history, every block the
  runs above run (the embedded stack for the Spark page); what one page leaves, the next meets.
- ``spark``: the Spark page's script with ``spark-submit`` (the Spark of this suite, on the embedded stack with
  Spark 3 and on the lakehouse with Spark 4: the run's pip constraint pins
  pyspark to it, and Iceberg's jars come from the suite's cache, as ``TIDEMARK_SPARK_JARS`` would give them to a
  user; downloading them is Spark's own ``--packages``), then the reading page (pandas, polars, DuckDB, ``tidemark
  serve`` and pyiceberg's REST catalog) and the history page (``tidemark gc``) on its tables.

The two Spark runs run once per CI run each: the newcomer's on make test's Spark 3.5 (it runs the Spark page's blocks,
on the embedded stack), the Spark page's own on make test-spark4's Spark 4, on the lakehouse.

README's install block runs on its own, in a copy of this checkout: it must build the wheel the runs install.

The shell blocks of a run are one bash script (``set -euo pipefail``). A Python block whose first line names a file
(``# quickstart.py: ...``) is saved under that name, as the page tells the reader to; any other runs where it
stands, after the page's earlier such blocks (a page's examples continue each other). A block ``in the background``
starts a server: the script goes on once its ``--port`` answers. Every ``pip install`` line runs first, into a fresh
venv and outside the script's network: the rest runs in a private network namespace (``unshare``), so the default
ports are the test's own and never another server's on this machine (hence ``SPARK_LOCAL_IP``: the namespace has
loopback only). The wheel the pages install is built from this checkout at the path they name.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from coordinator import EpochWriter
from coordinator.errors import TableNotFound
from coordinator.operations.lakehouse_server import EmbeddedLakehouse
from coordinator.operations.zookeeper_server import DEFAULT_PORT, EmbeddedZooKeeper
from coordinator.settings import Settings
from tests.helpers.docs import Block, blocks, page, section
from tests.helpers.wheel import build_wheel, copy_checkout

ROOT = Path(__file__).resolve().parent.parent
README = page("README.md")
PYPROJECT = (ROOT / "pyproject.toml").read_text()
DEADLINE_S = 420  # the spark run: pyspark's session, the job, the readers, the endpoint, GC
INSTALL_DEADLINE_S = 900  # a fresh venv: pyiceberg, pyarrow, pandas, polars, DuckDB, pyspark
PORT_DEADLINE_S = 120  # a server a page starts in the background answers within this
WHEEL = re.compile(r"'(dist/[^\[']+)")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
# What the pages print, as the runs check it. README's script: pandas, the big order above 2000; DuckDB, both big
# orders joined; `tidemark zk stop`.
README_PRINTS = (r"^\s*id\n0\s+3$", re.escape("[(2, 4000)]"), r"^stopped$")
TRINO_PRINTS = (r"^export PYICEBERG_CATALOG__LAKE__URI=", re.escape("[[2, 4000]]"))  # Trino's join through serve
# The Spark job's counts, read at one consistent version by its script.
SPARK_PRINTS = (r"^\|mark\|\s+1\|$", r"^\|tide\|\s+2\|$",
                r"^epoch \d+ of \['lake\.db\.word_counts', 'lake\.db\.words'\]$")
PYTHON_JOBS_PRINTS = (r"^committed epochs \[\d+, \d+, \d+\]$",)  # the pure-Python page's job
# `tidemark versions` after the history page's GC: a retained version of each pipeline in the tree, README's and
# the Spark page's, each tagged by its name.
HISTORY_PRINTS = (r"^pipeline big_orders:\n(  .*\n)+pipeline word_counts:\n  tidemark-word_counts-",)


@dataclass(frozen=True)
class Run:
    """The pages a run reads, in order; what a page assumes done before it (its text says so), and installed; the
    runs whose blocks it runs (``of``; its own by default)."""

    pages: tuple[str, ...]
    before: dict[str, str] = field(default_factory=dict)
    installs: tuple[str, ...] = ()
    of: tuple[str, ...] = ()
    deadline_s: int = DEADLINE_S


# A CI run runs the Spark page on both stacks, as it says ("on the lakehouse: after eval ... the same commands"): in the
# newcomer's run on Spark 3.5 (make test; the embedded stack, README's), and in its own on 4.1 (make test-spark4).
SPARK_ON_THE_LAKEHOUSE = int(importlib.metadata.version("pyspark").split(".")[0]) >= 4
RUNS = {
    "quickstart": Run(("README.md", "python-jobs.md"), before={"python-jobs.md": "tidemark zk start"}),
    "lakehouse": Run(("README.md", "lakehouse-quickstart.md", "components.md")),
    "spark": Run(("spark.md", "reading.md", "history.md"),
                 before={"spark.md": 'tidemark zk start && eval "$(tidemark lakehouse start)"'},
                 installs=("pip install 'dist/tidemark_iceberg-0.1.0-py3-none-any.whl[lakehouse]'",))
    if SPARK_ON_THE_LAKEHOUSE else Run(("spark.md", "reading.md", "history.md")),
    "newcomer": Run(("README.md", "lakehouse-quickstart.md", "spark.md", "python-jobs.md", "reading.md", "history.md"),
                    installs=("pip install 'dist/tidemark_iceberg-0.1.0-py3-none-any.whl[lakehouse]'",),
                    of=("quickstart", "lakehouse", "spark"), deadline_s=2 * DEADLINE_S),
}


def quickstart() -> str:
    return section(README, "Quickstart")


def run_blocks(run: str) -> list[Block]:
    of = set(RUNS[run].of or (run,))
    return [b for name in RUNS[run].pages for b in blocks(name) if of & set(b.runs)]


def install_lines(found: list[Block]) -> list[str]:
    return [re.sub(r"\s+#.*$", "", line) for b in found if b.language == "sh" for line in b.body.splitlines()
            if line.startswith("pip install ")]


def test_the_quickstart_is_one_screen_with_an_install_line_for_this_distribution():
    assert len(quickstart().splitlines()) <= 60, "the quickstart no longer fits on one screen"
    (line,) = install_lines(run_blocks("quickstart")[:1])
    found = re.fullmatch(r"pip install '(dist/([\w.]+)-([\w.]+)-py3-none-any\.whl)\[([\w,]+)\]'(?:\s+#.*)?", line)
    assert found, f"the quickstart installs {line!r}, not a wheel built from a clone"
    name = re.search(r'^name = "([^"]+)"$', PYPROJECT, re.M)
    version = re.search(r'^version = "([^"]+)"$', PYPROJECT, re.M)
    assert name is not None and version is not None
    assert found.group(2) == name.group(1).replace("-", "_"), f"the quickstart installs {found.group(2)}"
    assert found.group(3) == version.group(1), f"the wheel's version {found.group(3)} is not {version.group(1)}"
    for extra in found.group(4).split(","):
        assert re.search(rf"^{extra} = \[", PYPROJECT, re.M), f"pyproject.toml has no extra {extra!r}"


def test_readmes_install_block_builds_the_wheel_the_quickstart_installs(tmp_path):
    (block,) = [b for b in blocks("README.md") if "install" in b.runs]
    source = copy_checkout(tmp_path / "clone")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(HOME=str(tmp_path), PATH=os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                                         if not p.startswith(str(ROOT))))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.body], cwd=source, env=env, capture_output=True,
                          text=True, timeout=INSTALL_DEADLINE_S)
    assert done.returncode == 0, f"README's install block failed:\n{done.stdout}{done.stderr}"
    wheel = WHEEL.search(install_lines(run_blocks("quickstart"))[0])
    assert wheel is not None and (source / wheel.group(1)).is_file(), sorted((source / "dist").iterdir())


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


WAIT_FOR_PORT = f"""wait_for_port() {{ python - "$1" <<'TIDEMARK_WAIT'
import socket, sys, time
deadline = time.monotonic() + {PORT_DEADLINE_S}
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"port {{sys.argv[1]}} did not answer within {PORT_DEADLINE_S} s")
        time.sleep(0.2)
TIDEMARK_WAIT
}}"""


def script(run: str, found: list[Block], work: Path) -> str:
    """The run's blocks as one bash script; its Python files saved in ``work``; Maven Central read from the cache."""
    # the servers go with the script, whatever fails
    lines = ["trap 'kill $(jobs -p) 2>/dev/null || true; tidemark lakehouse stop >/dev/null 2>&1 || true; "
             "tidemark zk stop >/dev/null 2>&1 || true' EXIT", WAIT_FOR_PORT]
    earlier: dict[str, list[str]] = {}  # each page's Python blocks that ran where they stand, so far
    started: set[str] = set()
    for block in found:
        if block.page not in started:
            started.add(block.page)
            if block.page in RUNS[run].before:
                lines.append(RUNS[run].before[block.page])
        if block.language == "python" and block.saved_as:
            (work / block.saved_as).write_text(block.body)
        elif block.language == "python":
            earlier.setdefault(block.page, []).append(block.body)
            lines += ["python - <<'TIDEMARK_DOC_BLOCK'", *"\n".join(earlier[block.page]).splitlines(),
                      "TIDEMARK_DOC_BLOCK"]
        elif block.in_background:
            for line in block.body.splitlines():
                port = re.search(r"--port (\d+)", line)
                assert port, f"{block.page}: a server started in the background must name its --port: {line}"
                lines += [f"{line.split('#')[0].strip()} &", f"wait_for_port {port.group(1)}"]
        else:
            lines += [line for line in block.body.splitlines() if not line.startswith("pip install ")]
    return "\n".join(lines).replace(MAVEN_CENTRAL, f"file://{Settings.from_env().cache}/maven/") + "\n"


# The newcomer's run once per CI run, on make test's Spark: on Spark 4 it would add 3.5 minutes and nothing the
# lakehouse's spark run there does not cover.
# The Spark runs once per CI run each: the newcomer's on make test's Spark 3.5 (it runs the Spark page's blocks there,
# on the embedded stack), the Spark page's own on Spark 4 (make test-spark4), where it is on the lakehouse.
SPARK_MARKS = {"newcomer": (pytest.mark.spark, pytest.mark.skipif(SPARK_ON_THE_LAKEHOUSE,
                                                                  reason="make test runs it on Spark 3.5")),
               "spark": (pytest.mark.spark, pytest.mark.skipif(not SPARK_ON_THE_LAKEHOUSE,
                                                               reason="on Spark 3.5 the newcomer's run runs it"))}


@pytest.mark.parametrize("run", [pytest.param(r, marks=SPARK_MARKS.get(r, ())) for r in RUNS])
def test_the_docs_run_as_written(tmp_path, run):
    """Each run in a new home: its install lines into a fresh venv, then its blocks as one script."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    found = run_blocks(run)
    installs = install_lines(found) + list(RUNS[run].installs)
    wheel, _ = build_wheel(tmp_path / "build")
    (work / "dist").mkdir()
    for line in installs:
        named = WHEEL.search(line)
        if named:
            shutil.copy(wheel, work / named.group(1))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    constraints = tmp_path / "constraints.txt"  # the suite's Spark, whose jars its cache holds
    constraints.write_text(f"pyspark=={importlib.metadata.version('pyspark')}\n")
    # --no-compile: byte-compiling pandas, polars, pyarrow and pyspark takes a minute and tells nothing.
    installed = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(f"{i} --no-compile -q" for i in installs)],
                               cwd=work, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                              "PIP_CONSTRAINT": str(constraints)},
                               capture_output=True, text=True, timeout=INSTALL_DEADLINE_S)
    assert installed.returncode == 0, f"the install lines failed:\n{installed.stdout}{installed.stderr}"
    (work / "docs.sh").write_text(script(run, found, work))

    # The pages' defaults, not this machine's settings (the ZooKeeper server's class path stays).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TIDEMARK_", "PYICEBERG_", "SPARK_")) or k == "TIDEMARK_ZK_CLASSPATH"}
    env.update(TIDEMARK_HOME=str(home), HOME=str(tmp_path), PATH=f"{bin_dir}:{env['PATH']}",
               TIDEMARK_CACHE=str(Settings.from_env().cache), SPARK_LOCAL_IP="127.0.0.1")
    if run == "newcomer":  # a person's own default home, which the lakehouse page's `unset TIDEMARK_HOME` goes back to
        del env["TIDEMARK_HOME"]
        env.pop("XDG_DATA_HOME", None)
        home = tmp_path / ".local" / "share" / "tidemark"
    homes = [home, tmp_path / "tidemark-lakehouse"]  # the lakehouse page's own TIDEMARK_HOME
    prefix = _namespaced()
    if prefix is None and not _port_free(DEFAULT_PORT):
        pytest.fail(f"port {DEFAULT_PORT} is taken and this machine has no network namespaces (unshare): the "
                    "pages' `tidemark zk start` needs that port")
    command = ["bash", "-c", "ip link set lo up && exec bash -euo pipefail docs.sh"] if prefix else \
        ["bash", "-euo", "pipefail", "docs.sh"]
    process = subprocess.Popen([*(prefix or []), *command], cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=RUNS[run].deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the {run} run did not finish within {RUNS[run].deadline_s} s:\n{output}")
    finally:
        for each in homes:  # the script's trap failed: the test started them, end them
            server = EmbeddedZooKeeper(data_dir=each / "zookeeper").recorded_state()
            if server is not None and _alive(server.pid):
                os.kill(server.pid, signal.SIGKILL)
            EmbeddedLakehouse(each / "lakehouse").stop()
    assert process.returncode == 0, f"the {run} run failed (exit {process.returncode}):\n{output}"
    printed = {"quickstart": README_PRINTS + PYTHON_JOBS_PRINTS, "lakehouse": README_PRINTS + TRINO_PRINTS,
               "spark": SPARK_PRINTS,
               "newcomer": README_PRINTS + TRINO_PRINTS + SPARK_PRINTS + PYTHON_JOBS_PRINTS + HISTORY_PRINTS}[run]
    for pattern in printed:
        assert re.search(pattern, output, re.M), f"{pattern!r} not printed:\n{output}"
    if run in ("quickstart", "newcomer"):  # README's SQL statements, by tag or snapshot id
        statements = re.findall(r"^SELECT \* FROM lake\.db\.(\w+) FOR VERSION AS OF (\S+);$", output, re.M)
        tables = sorted(t for t, _ in statements)
        assert tables == ["big_orders", "orders"] if run == "quickstart" else {"big_orders", "orders"} <= set(tables), \
            output
    if run in ("lakehouse", "newcomer"):  # the tables went to the lakehouse, not to an embedded catalog on the side
        assert not (homes[1] / "catalog.db").exists()
    if run == "lakehouse":
        assert not (home / "catalog.db").exists()
    if run in ("lakehouse", "newcomer"):
        assert (homes[1] / "lakehouse" / "weed.log").is_file()
    if run in ("spark", "newcomer"):  # on the stack the run chose (the newcomer's: the README's, embedded)
        on_the_lakehouse = SPARK_ON_THE_LAKEHOUSE and run == "spark"
        assert (home / "catalog.db").exists() != on_the_lakehouse, output
        assert (home / "lakehouse" / "weed.log").is_file() == on_the_lakehouse, output


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
