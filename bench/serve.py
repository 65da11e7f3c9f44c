"""``tidemark serve`` against the catalog behind it: what a reader that knows nothing of Tidemark pays for consistency.

    python -m bench serve [--stack embedded lakehouse] [--loads 200] [--levels 200 1000] [--clients 200] [--seconds 20]
                          [--trino]
    python -m bench serve --race [--reads 2000] [--trino] [--no-scans]   # the switch race per engine

Per stack (``embedded``: SQLite and local files; ``lakehouse``: SeaweedFS's S3 store and REST catalog on loopback), on a
pipeline of two jobs (``up`` and ``down``, which copies it) with a history of epochs:

1. ``loadTable`` with pyiceberg, through the endpoint (a ``tidemark serve`` process) and from the backing catalog
   directly, interleaved: p50 and p99 of each (goal: the endpoint at most 1.2x the direct figure plus 2 ms); then
   at ``--levels`` concurrent clients (raw HTTP, each loading both tables once a second; directly: the REST catalog
   with its own token, or the SQLite row and metadata file), in turns (goal: at most the direct figure);
2. the pipeline taking epochs, alone and beside ``--clients`` concurrent clients (processes of threads, each its own
   keep-alive connection) each loading both tables through the endpoint once a second (a dashboard refreshing every
   second; raw HTTP, so the clients' own parsing does not take the shared cores), ``--seconds`` each, in 2-second
   slices taken in turns (alone, beside, beside, alone: an epoch's time grows with the tables' history): the loads'
   p50/p99 (goal: p99 under 50 ms), the CPU per load, and the writers' time per epoch (goal: within 1.1x of alone,
   the median of the turns' ratios). Twice: with the cores split (the writers and their servers on one half, the
   endpoint and its clients on the other, as separate pods are; the goal's figure) and shared (for reference);
3. with ``--trino`` (lakehouse only): a Trino query joining both tables through the endpoint and through the
   backing REST catalog, interleaved (goal: within 1.1x).

``--race`` measures the switch race instead: while both jobs take epochs back to back, each engine runs queries over
both tables through three endpoints: the switch rule off (``--query-gap-ms 0``, every load gets the newest version),
the default rule, and a pinned session (``warehouse=pipeline@pinned``); it prints how many queries saw two versions
(their two tables disagree). DuckDB and Trino (``--trino``) first, ``--reads / 60`` queries each, reading the
tables' rows (``--no-scans``: neither); then pyiceberg, ``--reads`` queries as a two-panel dashboard does (one
catalog; a panel of one table, then the query; loading only the snapshots its refs name,
``snapshot-loading-mode=refs``, so that a long run's growing history does not slow each load), judged by the
versions each load was served at, with the served version's age p50/p99 (the staleness each rule costs).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Optional

from coordinator import CatalogSettings, Tidemark
from coordinator.operations.zookeeper_server import free_port

from .common import STACKS, bench_lake, header, interleaved, percentile, verdict, zookeeper

LOAD_RATIO_GOAL, LOAD_SLACK_MS = 1.2, 2.0
CLIENTS_P99_GOAL_MS = 50.0
WRITERS_LAG_GOAL = 1.1
TRINO_RATIO_GOAL = 1.1
HISTORY_EPOCHS = 30
CLIENT_PROCESSES = 4
CLIENT_EVERY_S = 1.0  # each client's query (both tables loaded) once a second
CLIENTS_WARMUP_S = 2.0  # the clients connect and warm up before the writers are timed (their loads not counted)
SLICE_S = 2.0  # the writers are timed alone and beside the clients in slices this long, in turns (ABBA)
LAYOUTS = {  # --clients: where the writers and the endpoint run
    "split": "cores split (the writers, ZooKeeper and the catalog on half the cores; the endpoint and its clients on "
             "the other half, as separate pods would be)",
    "shared": "cores shared (the writers, the endpoint and its clients all on the same cores: the clients' CPU "
              "competes too)",
}
SLOW_LORIS_READERS = 8  # clients loading back to back beside the slow-loris connections
SLOW_LORIS_P99_GOAL_MS = 10.0  # how far their p99 may move
RACE_PAUSE_S = 0.5  # --race: the pipeline's pause between epochs (an epoch every 0.6-0.8 s on the lakehouse)
RACE_SCAN_S = 0.05  # --race: a dashboard panel's scan takes up to this long (uniformly drawn)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", nargs="+", choices=STACKS, default=list(STACKS))
    parser.add_argument("--loads", type=int, default=200, help="loadTable calls timed per side")
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients through the endpoint")
    parser.add_argument("--levels", type=int, nargs="*", default=[200, 1000], help="concurrent clients loading tables "
                        "through the endpoint and from the catalog directly (one client: --loads)")
    parser.add_argument("--level-seconds", type=float, default=4.0, help="each level's turn per side (two each)")
    parser.add_argument("--seconds", type=float, default=20.0, help="the writers' time alone, and beside the clients")
    parser.add_argument("--slow-clients", type=int, default=100, help="slow-loris connections beside the clients")
    parser.add_argument("--trino", action="store_true", help="also time a Trino join (lakehouse)")
    parser.add_argument("--race", action="store_true", help="measure the switch race per engine instead")
    parser.add_argument("--no-scans", dest="scans", action="store_false", help="--race: pyiceberg's dashboard only, "
                        "not the engines that read the rows (DuckDB, Trino)")
    parser.add_argument("--reads", type=int, default=2000, help="--race: a dashboard's queries per endpoint (DuckDB's "
                        "and Trino's: a tenth)")
    args = parser.parse_args(argv)
    with zookeeper() as zk:
        for stack in args.stack:
            with tempfile.TemporaryDirectory(prefix="tidemark-bench-serve-") as home, \
                    bench_lake(Path(home), stack) as settings:
                run_stack(stack, settings, zk.connect_string + f"/bench-serve-{uuid.uuid4().hex[:6]}", Path(home), args)
    return 0


def run_stack(stack: str, settings: CatalogSettings, connect: str, home: Path, args: argparse.Namespace) -> None:
    from tests.helpers.mixed_lake import MixedLake

    tm = Tidemark.connect(connect)
    lake = MixedLake(settings.load(), settings, f"bench_{uuid.uuid4().hex[:6]}")
    lake.open(tm)
    epoch = 1000
    for _ in range(HISTORY_EPOCHS):
        lake.root_epoch(lake.up, epoch)
        lake.copy_epoch(epoch)
        epoch += 1000
    server, url = _serve(settings, connect, home / "serve.log")
    try:
        if args.race:
            header(f"tidemark serve, {stack} stack: the switch race, per engine, while both jobs take epochs")
            _switch_race(settings, connect, url, lake, epoch, home, args)
            return
        header(f"tidemark serve, {stack} stack: loadTable with pyiceberg, through the endpoint vs the catalog directly")
        _load_latency(settings, url, lake.down, args.loads)
        if args.levels:
            header(f"tidemark serve, {stack} stack: loadTable at {', '.join(map(str, args.levels))} concurrent "
                   "clients (raw HTTP, each loading both tables once a second), through the endpoint vs the catalog "
                   "directly, in turns")
            identifiers = [t.split(".", 1)[1] if t.count(".") > 1 else t for t in (lake.up, lake.down)]
            _loads_at_levels(settings, url, identifiers, args.levels, args.level_seconds)
        header(f"tidemark serve, {stack} stack: the pipeline alone and beside {args.clients} clients loading "
               "tables through the endpoint, in turns")
        _beside_clients(lake, epoch, url, server.pid, [lake.up, lake.down], args)
        header(f"tidemark serve, {stack} stack: clients' loads beside {args.slow_clients} slow-loris connections "
               "(a byte a second each, reconnecting when closed), in turns")
        _beside_slow_loris(url, server.pid, [lake.up, lake.down], args.slow_clients)
        if args.trino and stack == "lakehouse":
            header("tidemark serve, lakehouse: a Trino join through the endpoint vs the REST catalog directly")
            _trino(settings, url, lake, home)
    finally:
        server.terminate()
        server.wait(30)
        lake.close()
        tm.close()


def _serve(settings: CatalogSettings, connect: str, log_path: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """A ``tidemark serve`` process on a free port with ``options``, serving: the process and its URL."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYICEBERG_CATALOG__", "TIDEMARK_CATALOG"))},
           **settings.environment()}
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "coordinator.operations.cli", "--zk", connect, "serve",
                                   "--port", str(port), *options], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    _wait_serving(url, server)
    return server, url


def _switch_race(settings: CatalogSettings, connect: str, url: str, lake, epoch: int, home: Path,
                 args: argparse.Namespace) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    from coordinator.history.readers import _s3_secret
    from tests.helpers.mixed_lake import MovingPipeline
    from tests.helpers.served import as_pairs, duckdb_read, own_storage, two_table_sql
    from tests.helpers.trino import TrinoServer, served_catalog
    rule_off, off_url = _serve(settings, connect, home / "serve-rule-off.log", "--query-gap-ms", "0")
    endpoints = {"rule off": (off_url, ""), "default rule": (url, ""), "pinned": (url, "pipeline@pinned")}
    secret = _s3_secret(settings.name, settings.python_catalog_properties()) or ""
    tables = [t.split(".", 1)[1] if t.count(".") > 1 else t for t in (lake.up, lake.down)]
    committed: dict[int, float] = {}  # epoch -> when both jobs had committed it (wall clock)

    class TimedPipeline(MovingPipeline):
        def step(self) -> None:
            epoch = self.epoch
            super().step()
            committed[epoch] = time.time()
    moving = TimedPipeline(lake, epoch, pause_s=RACE_PAUSE_S).start()
    try:
        # The engines that read the tables' rows first, while the tables are small (every epoch adds files to both).
        def duckdb(url: str, warehouse: str):
            return lambda: duckdb_read(url, warehouse, secret, two_table_sql("served", *tables))
        if args.scans:
            _race_line("DuckDB (a session per query: ATTACH, one query)",
                       {label: duckdb(*endpoint) for label, endpoint in endpoints.items()}, max(1, args.reads // 60))
        if args.scans and args.trino:  # one Trino, a catalog per endpoint
            names = {"rule off": "rule_off", "default rule": "default_rule", "pinned": "pinned"}
            files = {names[label]: served_catalog(served) +
                     (f"iceberg.rest-catalog.warehouse={warehouse}\n" if warehouse else "")
                     for label, (served, warehouse) in endpoints.items()}
            with TrinoServer(home / "trino", catalogs=files, env=settings.environment()) as trino:
                _race_line("Trino (a query: both tables loaded while planning)",
                           {label: (lambda c=names[label]: as_pairs(trino.query(two_table_sql(c, *tables))[0]))
                            for label in endpoints}, max(1, args.reads // 60))

        def dashboard(url: str, warehouse: str):
            """One long-lived catalog refreshing two panels: ``down`` alone, then ``up`` and ``down`` loaded back to
            back; each panel's scan is its time (``RACE_SCAN_S`` at most), not its work, so that a long run's
            growing tables need not be read. The versions come from each load's ``Tidemark-Epoch``."""
            catalog = RestCatalog("served", uri=url, **own_storage(settings), **{"snapshot-loading-mode": "refs"},
                                  **({"warehouse": warehouse} if warehouse else {}))
            epochs: list[int] = []
            ages: list[float] = []  # each load's served version's age: since it was committed (the rule's cost)

            def seen(response, *_, **__) -> None:
                if "Tidemark-Epoch" in response.headers:
                    epochs.append(int(response.headers["Tidemark-Epoch"]))
                    if epochs[-1] in committed:
                        ages.append((time.time() - committed[epochs[-1]]) * 1000)
            catalog._session.hooks["response"].append(seen)

            def query() -> tuple[int, int]:
                catalog.load_table(tables[1])
                time.sleep(random.uniform(0, RACE_SCAN_S))
                del epochs[:]
                for table in tables:
                    catalog.load_table(table)
                time.sleep(random.uniform(0, RACE_SCAN_S))
                up, down = epochs
                return up, down
            query.ages = ages  # type: ignore[attr-defined]
            return query
        _race_line("pyiceberg, a two-panel dashboard (one catalog: down alone, then both tables loaded)",
                   {label: dashboard(*endpoint) for label, endpoint in endpoints.items()}, args.reads)
    finally:
        moving.stop()
        rule_off.terminate()
        rule_off.wait(30)


def _race_line(engine: str, reads: dict, count: int) -> None:
    """``count`` queries per endpoint, interleaved: how many saw their two tables at different versions."""
    mixed = dict.fromkeys(reads, 0)
    for _ in range(count):
        for label, read in reads.items():
            up, down = read()
            mixed[label] += up != down
    print(f"  {engine}: queries that saw two versions, of {count}: " +
          ", ".join(f"{label} {n}" for label, n in mixed.items()), flush=True)
    ages = {label: read.ages for label, read in reads.items() if getattr(read, "ages", None)}
    if ages:
        figures = [f"{label} {percentile(a, 0.5):.0f} / {percentile(a, 0.99):.0f} ms" for label, a in ages.items()]
        print("    the served version's age, p50 / p99: " + ", ".join(figures), flush=True)


def _wait_serving(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"tidemark serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("tidemark serve did not answer within 60 s")


def _load_latency(settings: CatalogSettings, url: str, table: str, loads: int) -> None:
    from pyiceberg.catalog.rest import RestCatalog
    direct, served = settings.load(), RestCatalog("served", uri=url)
    identifier = settings.identifier(table)
    through, backing = interleaved(lambda: served.load_table(identifier), lambda: direct.load_table(identifier),
                                   warmup=10, repeat=loads)
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        mine, base = percentile(through, q) * 1000, percentile(backing, q) * 1000
        goal = base * LOAD_RATIO_GOAL + LOAD_SLACK_MS
        print(f"  {name}: through the endpoint {mine:7.2f} ms, the catalog directly (baseline) {base:7.2f} ms, "
              f"{mine / base:5.2f}x; goal <= {LOAD_RATIO_GOAL}x + {LOAD_SLACK_MS:g} ms = {goal:.2f} ms: "
              f"{verdict(mine <= goal)}", flush=True)


def _beside_clients(lake, first_epoch: int, url: str, server_pid: int, tables: list[str],
                    args: argparse.Namespace) -> None:
    epoch = [first_epoch]

    def run_pipeline(seconds: float) -> list[float]:
        took = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            start = time.perf_counter()
            lake.root_epoch(lake.up, epoch[0])
            lake.copy_epoch(epoch[0])
            took.append(time.perf_counter() - start)
            epoch[0] += 1000
        return took

    per_process = max(1, args.clients // CLIENT_PROCESSES)
    identifiers = [t.split(".", 1)[1] if t.count(".") > 1 else t for t in tables]
    cores = sorted(os.sched_getaffinity(0))
    writers_cores, serving_cores = set(cores[:len(cores) // 2]), set(cores[len(cores) // 2:])
    layouts = {"split": (writers_cores, serving_cores), "shared": (set(cores), set(cores))}
    for layout, (writers, serving) in layouts.items():
        if layout == "split" and not writers:
            continue  # one core: nothing to split
        _pin_tree(os.getpid(), writers)  # the writers, ZooKeeper and the catalog's servers
        _pin_tree(server_pid, serving)
        print(f"  {LAYOUTS[layout]}:", flush=True)
        stop, active = multiprocessing.Event(), multiprocessing.Event()
        results: multiprocessing.Queue = multiprocessing.Queue()
        processes = [multiprocessing.Process(target=_clients, args=(_http_loads(url), identifiers, per_process, serving,
                                                                    active, stop, results))
                     for _ in range(CLIENT_PROCESSES)]
        for process in processes:
            process.start()
        active.set()
        time.sleep(CLIENTS_WARMUP_S)
        alone: list[float] = []
        beside: list[float] = []
        ratios: list[float] = []  # per turn of four slices: the writers' mean time beside the clients over alone
        server_cpu = 0.0
        # Alone and beside in short turns, ABBA: the tables' metadata grows with every epoch, and an epoch's time
        # with it; each turn's ratio compares epochs of about the same history.
        for _ in range(max(1, round(args.seconds / (2 * SLICE_S)))):
            times: dict[bool, list[float]] = {False: [], True: []}
            for with_clients in (False, True, True, False):
                if with_clients:
                    active.set()
                    before = _cpu_seconds(server_pid)
                    times[True] += run_pipeline(SLICE_S)
                    server_cpu += _cpu_seconds(server_pid) - before
                else:
                    active.clear()
                    times[False] += run_pipeline(SLICE_S)
            alone += times[False]
            beside += times[True]
            ratios.append(statistics.fmean(times[True]) / statistics.fmean(times[False]))
        stop.set()
        active.set()
        latencies: list[float] = []
        errors, clients_cpu = 0, 0.0
        for _ in processes:
            found, failed, cpu = json.loads(results.get(timeout=120))
            latencies += found
            errors += failed
            clients_cpu += cpu
        for process in processes:
            process.join(60)
        p99 = percentile(latencies, 0.99) * 1000
        print(f"    clients: {len(latencies)} loads by {per_process * CLIENT_PROCESSES} clients, {errors} failed; "
              f"p50 {percentile(latencies, 0.5) * 1000:.1f} ms, p99 {p99:.1f} ms; goal p99 < "
              f"{CLIENTS_P99_GOAL_MS:g} ms: {verdict(p99 < CLIENTS_P99_GOAL_MS)}", flush=True)
        print(f"    CPU per load: the endpoint {server_cpu / max(1, len(latencies)) * 1000:.2f} ms, the clients "
              f"{clients_cpu / max(1, len(latencies)) * 1000:.2f} ms", flush=True)
        ratio = statistics.median(ratios)
        judged = f"goal <= {WRITERS_LAG_GOAL}x: {verdict(ratio <= WRITERS_LAG_GOAL)}"
        print(f"    writers' time per epoch (both jobs): beside the clients p50 "
              f"{percentile(beside, 0.5) * 1000:.0f} ms, alone (baseline) p50 {percentile(alone, 0.5) * 1000:.0f} "
              f"ms; median of {len(ratios)} turns' ratios {ratio:.2f}x; {judged}", flush=True)
    _pin_tree(os.getpid(), set(cores))
    _pin_tree(server_pid, set(cores))


def _beside_slow_loris(url: str, server_pid: int, tables: list[str], slow: int) -> None:
    """``SLOW_LORIS_READERS`` clients' loads (keep-alive, back to back) alone and beside ``slow`` connections that each
    send a request's head a byte a second (reconnecting when the server closes one), in ABBA turns: the loads' p99
    both ways (goal: within ``SLOW_LORIS_P99_GOAL_MS``), and the server's threads and memory (goal: bounded)."""
    import http.client
    import socket
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    paths = [f"/v1/pipeline/namespaces/{t.split('.')[-2]}/tables/{t.split('.')[-1]}" for t in tables]

    def loads(seconds: float) -> list[float]:
        found: list[float] = []

        def reader() -> None:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for path in paths:
                    start = time.perf_counter()
                    conn.request("GET", path)
                    conn.getresponse().read()
                    found.append(time.perf_counter() - start)
            conn.close()
        readers = [threading.Thread(target=reader) for _ in range(SLOW_LORIS_READERS)]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join()
        return found

    stop = threading.Event()
    closed = [0]

    def loris() -> None:
        sockets: list[Optional[socket.socket]] = [None] * slow
        while not stop.wait(1.0):
            for i, conn in enumerate(sockets):
                try:
                    if conn is None:
                        conn = sockets[i] = socket.create_connection((host, int(port)), timeout=5)
                    conn.sendall(b"G")
                except OSError:
                    closed[0] += 1
                    sockets[i] = None
        for conn in sockets:
            if conn is not None:
                conn.close()
    loads(SLICE_S)  # warm up: the answers kept, the connections made
    before = _threads_and_rss(server_pid)
    alone, beside, during = [], [], before
    for turn in (False, True, True, False) * 2:
        if not turn:
            alone += loads(SLICE_S)
            continue
        stop.clear()
        attacker = threading.Thread(target=loris, daemon=True)
        attacker.start()
        time.sleep(2.0)  # the slow connections open
        beside += loads(SLICE_S)
        during = max(during, _threads_and_rss(server_pid))
        stop.set()
        attacker.join(30)
    moved = (percentile(beside, 0.99) - percentile(alone, 0.99)) * 1000
    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:.1f}"
    print(f"  loads: alone (baseline) p50 {ms(alone, 0.5)} / p99 {ms(alone, 0.99)} ms, beside the slow connections "
          f"p50 {ms(beside, 0.5)} / p99 {ms(beside, 0.99)} ms; p99 moved {moved:+.1f} ms; goal < "
          f"{SLOW_LORIS_P99_GOAL_MS:g} ms: {verdict(moved < SLOW_LORIS_P99_GOAL_MS)}", flush=True)
    print(f"  the server: threads {before[0]} before, {during[0]} at most beside them; memory {before[1] / 1024:.0f} "
          f"MB before, {during[1] / 1024:.0f} MB at most; slow connections the server closed: {closed[0]}", flush=True)


def _threads_and_rss(pid: int) -> tuple[int, int]:
    """A process's threads and resident memory (kB), from ``/proc/<pid>/status``."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def _pin_tree(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` and of its descendants runs on ``cores`` only (threads made later inherit it)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(_stat_fields(int(stat.parent.name))[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    todo = [pid]
    while todo:
        process = todo.pop()
        todo += children.get(process, [])
        for task in Path(f"/proc/{process}/task").glob("[0-9]*"):
            try:
                os.sched_setaffinity(int(task.name), cores)
            except OSError:
                pass  # exited meanwhile


def _cpu_seconds(pid: int) -> float:
    """The CPU time ``pid`` has used, user and system (``/proc/<pid>/stat``)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat``'s fields after the command's name (which may hold spaces): state, ppid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _clients(connect: Callable[[], Callable[[str], None]], tables: list[str], count: int, cores: set[int], active,
             stop, results) -> None:
    """``count`` client threads, each with a connection of its own (``connect()``: a load of one table), loading
    ``tables`` once every ``CLIENT_EVERY_S`` (starting at random offsets) until ``stop``, only while ``active``; puts
    the latencies after the warm-up, the failed loads and the process's CPU time into ``results``."""
    os.sched_setaffinity(0, cores)
    warm_until = time.monotonic() + CLIENTS_WARMUP_S
    warm_cpu: list[float] = []  # the process's CPU time when the warm-up ended
    warmed = threading.Timer(CLIENTS_WARMUP_S, lambda: warm_cpu.append(_process_cpu()))
    warmed.start()
    latencies: list[float] = []
    failed = [0]
    lock = threading.Lock()

    def client() -> None:
        load = connect()
        mine = []
        next_query = time.monotonic() + random.uniform(0, CLIENT_EVERY_S)
        while not stop.wait(max(0.0, next_query - time.monotonic())):
            next_query += CLIENT_EVERY_S
            if not active.is_set():  # the writers are timed alone meanwhile
                active.wait()
                next_query = time.monotonic() + random.uniform(0, CLIENT_EVERY_S)
                continue
            for table in tables:
                start = time.perf_counter()
                try:
                    load(table)
                except Exception:  # noqa: BLE001 - a failed load is counted, whatever failed
                    with lock:
                        failed[0] += 1
                    load = connect()
                    continue
                if time.monotonic() > warm_until:
                    mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)
    threads = [threading.Thread(target=client, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    warmed.join()
    results.put(json.dumps([latencies, failed[0], _process_cpu() - (warm_cpu or [0.0])[0]]))


def _http_loads(url: str, headers: Optional[dict[str, str]] = None,
                warehouse: str = "") -> Callable[[], Callable[[str], None]]:
    """Loads of a REST catalog's tables over raw HTTP (``GET /v1/{prefix}/namespaces/{ns}/tables/{t}`` on one
    keep-alive connection, after ``/v1/config``, as an engine's REST client does): the catalog's latency, not
    the time clients sharing this machine's cores take to parse the metadata."""
    import http.client
    from urllib.parse import quote, urlsplit
    where = urlsplit(url)

    def connect() -> Callable[[str], None]:
        connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=60)

        def get(path: str) -> bytes:
            connection.request("GET", where.path.rstrip("/") + path, headers=headers or {})
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise OSError(f"{path}: HTTP {response.status}")
            return body
        config = json.loads(get("/v1/config" + (f"?warehouse={quote(warehouse)}" if warehouse else "")))
        prefix = {**config.get("defaults", {}), **config.get("overrides", {})}.get("prefix")
        base = f"/v1/{quote(prefix, safe='')}" if prefix else "/v1"

        def load(table: str) -> None:
            namespace, name = table.rsplit(".", 1)
            get(f"{base}/namespaces/{quote(namespace)}/tables/{quote(name)}")
        return load
    return connect


def _direct_loads(settings: CatalogSettings) -> Callable[[], Callable[[str], None]]:
    """Loads of the backing catalog's tables as a client reaches them without the endpoint: a REST catalog over raw
    HTTP with its own bearer token (as ``_http_loads`` through the endpoint); the embedded SQL catalog as its row
    and metadata file read, each client with a connection of its own (SQLite has no server to load through)."""
    properties = settings.python_catalog_properties()
    if settings.uri is None or not settings.uri.startswith("sqlite:"):
        token = _client_credentials_token(properties["oauth2-server-uri"], properties["credential"])
        return _http_loads(properties["uri"], {"Authorization": f"Bearer {token}"}, properties.get("warehouse", ""))
    import sqlite3
    database = settings.uri.removeprefix("sqlite:///")

    def connect() -> Callable[[str], None]:
        connection = sqlite3.connect(database, check_same_thread=False)

        def load(table: str) -> None:
            namespace, name = table.rsplit(".", 1)
            location, = connection.execute(
                "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? AND "
                "table_name = ?", (settings.name, namespace, name)).fetchone()
            Path(location.removeprefix("file://")).read_bytes()
        return load
    return connect


def _client_credentials_token(token_uri: str, credential: str) -> str:
    """An OAuth2 bearer token for ``credential`` (``id:secret``) from ``token_uri`` (the client credentials grant)."""
    from urllib.parse import urlencode
    client_id, _, secret = credential.partition(":")
    form = urlencode({"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret,
                      "scope": "catalog"}).encode()
    with urllib.request.urlopen(urllib.request.Request(token_uri, data=form), timeout=30) as answer:
        return str(json.loads(answer.read())["access_token"])


def _loads_at_levels(settings: CatalogSettings, url: str, tables: list[str], levels: list[int],
                     turn_s: float) -> None:
    """At each level of concurrent clients (``CLIENT_PROCESSES`` processes of threads, each client a connection of
    its own loading every one of ``tables`` once a second), ``loadTable`` through the endpoint and from the backing
    catalog directly, in turns (endpoint, direct, direct, endpoint; ``turn_s`` each): p50 and p99 of each (goal:
    the endpoint at most the direct figure)."""
    sides = {"through the endpoint": _http_loads(url), "the catalog directly (baseline)": _direct_loads(settings)}
    cores = set(os.sched_getaffinity(0))
    for clients in levels:
        found: dict[str, list[float]] = {side: [] for side in sides}
        failed = dict.fromkeys(sides, 0)
        for side in (*sides, *reversed(sides)):
            stop, active = multiprocessing.Event(), multiprocessing.Event()
            active.set()
            results: multiprocessing.Queue = multiprocessing.Queue()
            per_process = max(1, clients // CLIENT_PROCESSES)
            processes = [multiprocessing.Process(target=_clients, args=(sides[side], tables, per_process, cores,
                                                                        active, stop, results))
                         for _ in range(CLIENT_PROCESSES)]
            for process in processes:
                process.start()
            time.sleep(CLIENTS_WARMUP_S + turn_s)
            stop.set()
            for _ in processes:
                latencies, errors, _cpu = json.loads(results.get(timeout=120))
                found[side] += latencies
                failed[side] += errors
            for process in processes:
                process.join(60)
        (mine, base) = found.values()
        figures = ", ".join(f"{side} p50 {percentile(v, 0.5) * 1000:.1f} / p99 {percentile(v, 0.99) * 1000:.1f} ms "
                            f"({len(v)} loads, {failed[side]} failed)" for side, v in found.items())
        met = percentile(mine, 0.5) <= percentile(base, 0.5) and percentile(mine, 0.99) <= percentile(base, 0.99)
        print(f"  {clients} clients: {figures}; goal: the endpoint at most the direct figure: {verdict(met)}",
              flush=True)


def _process_cpu() -> float:
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _trino(settings: CatalogSettings, url: str, lake, home: Path) -> None:
    from tests.helpers.trino import S3_PROPERTIES, TrinoServer, served_catalog
    props = settings.python_catalog_properties()
    direct = "\n".join(["connector.name=iceberg", "iceberg.catalog.type=rest",
                        f"iceberg.rest-catalog.uri={props['uri']}",
                        f"iceberg.rest-catalog.warehouse={props.get('warehouse', '')}",
                        "iceberg.rest-catalog.security=OAUTH2",
                        f"iceberg.rest-catalog.oauth2.credential={props['credential']}",
                        f"iceberg.rest-catalog.oauth2.server-uri={props['oauth2-server-uri']}", *S3_PROPERTIES, ""])
    served = served_catalog(url)
    env = settings.environment()
    with TrinoServer(home / "trino", catalogs={"served": served, "direct": direct}, env=env) as trino:
        def query(catalog: str):
            return lambda: trino.query(f"SELECT count(*) FROM {catalog}.{lake.up} u JOIN {catalog}.{lake.down} d "
                                       "ON u.epoch = d.epoch AND u.row = d.row")
        through, backing = interleaved(query("served"), query("direct"), warmup=3, repeat=15)
    mine, base = percentile(through, 0.5), percentile(backing, 0.5)
    print(f"  Trino join p50: through the endpoint {mine * 1000:.0f} ms, the REST catalog directly (baseline) "
          f"{base * 1000:.0f} ms, {mine / base:.2f}x; goal <= {TRINO_RATIO_GOAL}x: "
          f"{verdict(mine <= base * TRINO_RATIO_GOAL)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
