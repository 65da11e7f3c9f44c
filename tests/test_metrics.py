"""Driver metrics, the exporter, the alert rules and the dashboard, on real ZooKeeper and real EpochWriter loops.

One module-scoped run: two pure-Python drivers (``up`` reads the root table ``raw``; ``down``
reads ``up``) run their epoch loops in this process, each with its own registry and HTTP
port, next to an exporter; ``up`` also rolls a precommitted epoch forward, recomputes a
started one and is fenced once. The tests then check what was scraped, lint every series,
and check that every query of the dashboard and of the alert rules names a real series.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator import EmbeddedZooKeeper, EpochContext, EpochWriter, Tidemark
from coordinator.job.driver_metrics import PHASES
from coordinator.job.metrics_server import MetricsServer
from coordinator.operations.exporter import Exporter
from coordinator.operations.zookeeper_server import free_port
from coordinator.records import EpochInputs, now_ms
from tests.helpers.background import InBackground
from tests.helpers.cli import TIDEMARK
from tests.helpers.lake import SCHEMA, create_table
from tests.helpers.metrics_lint import lint_exposition, series_names
from tests.helpers.present import present
from tests.helpers.promql import RuleEvaluator, Sample, Series, returned, scraped_series
from tests.helpers.wait import wait_for

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "helm" / "tidemark" / "dashboards" / "tidemark.json"
RULES = REPO / "helm" / "tidemark" / "alerts" / "tidemark-rules.yaml"
INTERVAL = 500


def scrape(port: int, path: str = "/metrics", timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(body: str) -> dict[tuple, float]:
    """``{(name, (label, value), ...): value}``, labels sorted."""
    return {(s.name, *sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(body: str, name: str, **labels: str) -> float:
    found = samples(body).get((name, *sorted(labels.items())))
    assert found is not None, f"no series {name}{labels} in the scrape"
    return found


@dataclass
class Scraped:
    drivers: str                   # /metrics of the port both drivers share, during their loops
    drivers_at: float              # wall clock (Unix seconds) of that scrape
    up_committed: tuple[int, int]  # epochs the up writer had committed just before and just after it
    up_registry: str               # the up writer's own registry at the same time
    exporter: str
    exporter_at: float
    health: list[int]              # /healthz: both loops running, up's run returned, both returned


@pytest.fixture(scope="module")
def scraped(zk_server, catalog_settings):
    chroot = f"{zk_server.connect_string}/t-metrics-{uuid.uuid4().hex[:6]}"
    sessions = [Tidemark.connect(chroot, session_timeout=4.0, operation_timeout=20) for _ in range(3)]
    tm, up_tm, down_tm = sessions
    namespace = "ns_" + uuid.uuid4().hex[:8]
    raw, up, down = (f"{catalog_settings.name}.{namespace}.{t}" for t in ("raw", "up", "down"))
    catalog = catalog_settings.load()
    for table in (raw, up, down):
        create_table(catalog, catalog_settings.identifier(table))
    raw_table = catalog.load_table(catalog_settings.identifier(raw))

    def append_raw(n: int = 3) -> None:
        raw_table.append(pa.table({"epoch": [now_ms()] * n, "row": list(range(n))}, schema=SCHEMA))

    port = free_port()  # both writers on one port: one server, one exposition, two registries

    def writer(session, name, sources, sinks) -> EpochWriter:
        return EpochWriter(session, name, sources=sources, sinks=sinks, catalog=catalog_settings,
                           interval_ms=INTERVAL, grace_ms=100, metrics_port=port)
    up_writer, down_writer = writer(up_tm, "up", [raw], [up]), writer(down_tm, "down", [up], [down])
    tm.register_job("down", sources=[up], sinks=[down])  # the whole pipeline first: down never reads up by time

    # A precommitted epoch left by a leader that stepped down: the next open rolls it forward.
    up_writer.open(leader_timeout=30)
    grid = tm.barriers.grid()
    first = grid.floor(now_ms())
    up_writer.epochs.begin(first, up_writer.inputs_for(first))
    up_writer.epochs.precommit(first, {up: None})
    up_writer.close()
    up_writer.open(leader_timeout=30)
    assert up_writer.committed == [first]
    # A started epoch with new rows: the loop recomputes it from its recorded inputs.
    append_raw()
    appended = now_ms()
    second = wait_for(lambda: (t := grid.floor(now_ms())) > appended and t, "a grid point after the append")
    inputs = up_writer.inputs_for(second)
    assert isinstance(inputs, EpochInputs) and not inputs.unchanged
    up_writer.epochs.begin(second, inputs)
    up_writer.close()

    exporter = Exporter(lambda: Tidemark.connect(chroot, read_only=True, operation_timeout=5), refresh_every=0.5)
    exporter_server = MetricsServer(0, "127.0.0.1")
    exporter_server.attach(exporter.registry, healthy=exporter.alive)
    running = [InBackground(up_writer, lambda ctx: ctx.append(up, ctx.changes(raw))),
               InBackground(down_writer, lambda ctx: ctx.append(down, ctx.changes(up)))]
    exporter.start()
    try:
        wait_for(lambda: second in up_writer.committed, "the started epoch to be recomputed")
        append_raw()
        computed = len(up_writer.committed)
        wait_for(lambda: len(up_writer.committed) >= computed + 3 and len(down_writer.committed) >= 3,
                 "a few more epochs of both jobs")
        tm.fence_job("up")
        wait_for(lambda: value(scrape(port)[1], "tidemark_driver_fencings_total",
                               tidemark_job="up") == 1, "the up driver to count its fencing")
        append_raw()
        after_fence = len(up_writer.committed)
        wait_for(lambda: len(up_writer.committed) >= after_fence + 2 and up_writer.leadership.is_leading,
                 "up to lead again and commit")
        wait_for(lambda: len(down_writer.committed) >= 5, "down to keep up")
        drivers_at, committed_before = time.time(), len(up_writer.committed)
        drivers_body = scrape(port)[1]
        committed_range = (committed_before, len(up_writer.committed))
        up_registry = generate_latest(up_writer.metrics.registry).decode()
        health = [scrape(port, "/healthz")[0]]
        wait_for(lambda: exporter.up(), "the exporter's view")
        exporter_at = time.time()
        exporter_body = scrape(exporter_server.port)[1]
        for run in running:
            run.stop()
            health.append(scrape(port, "/healthz")[0])
    finally:
        for run in running:
            run.writer.stop()
            run.thread.join(60)
            run.writer.metrics.close()
        exporter_server.close()
        exporter.close()
        for session in sessions:
            session.close()
    yield Scraped(drivers_body, drivers_at, committed_range, up_registry, exporter_body, exporter_at, health)


def test_a_driver_serves_every_series_with_sensible_values_during_its_epoch_loop(scraped):
    body, at = scraped.drivers, scraped.drivers_at
    job = {"tidemark_job": "up"}
    for phase in PHASES:
        assert value(body, "tidemark_driver_epoch_phase_duration_seconds_count", phase=phase, **job) > 0, phase
        total = value(body, "tidemark_driver_epoch_phase_duration_seconds_sum", phase=phase, **job)
        assert 0 < total < 120, f"{phase}: {total} s"
    committed = value(body, "tidemark_driver_epochs_committed_total", **job)
    assert scraped.up_committed[0] <= committed <= scraped.up_committed[1] and committed >= 6
    assert value(body, "tidemark_driver_epochs_idle_total", **job) >= 1
    assert value(body, "tidemark_driver_epochs_idle_total", **job) < committed
    assert value(body, "tidemark_driver_epochs_recomputed_total", **job) == 1
    assert value(body, "tidemark_driver_epochs_rolled_forward_total", **job) == 1
    assert value(body, "tidemark_driver_fencings_total", **job) == 1
    assert value(body, "tidemark_driver_leadership_changes_total", change="acquired", **job) == 4
    assert value(body, "tidemark_driver_leadership_changes_total", change="stepped_down", **job) == 3
    assert value(body, "tidemark_driver_leader", **job) == 1
    assert value(body, "tidemark_driver_term", **job) == 5  # 3 opens, the operator's fence, the takeover after it
    assert value(body, "tidemark_driver_zookeeper_connection_state", state="connected", **job) == 1
    assert value(body, "tidemark_driver_zookeeper_connection_state", state="suspended", **job) == 0
    assert value(body, "tidemark_driver_zookeeper_connection_changes_total", state="lost", **job) == 0
    assert value(body, "tidemark_driver_retries_total", operation="zookeeper", **job) >= 0
    epoch = value(body, "tidemark_driver_committed_epoch_timestamp_seconds", **job)
    lag = value(body, "tidemark_driver_lag_seconds", **job)
    assert abs(lag - (at - epoch)) < 5 and 0 <= lag < 20 * INTERVAL / 1000, lag  # a few intervals, not ms
    # up and down are one pipeline (down reads up's table), named after its first job by name.
    pipeline = {**job, "tidemark_pipeline": "down"}
    consistent = value(body, "tidemark_driver_consistent_epoch_timestamp_seconds", **pipeline)
    assert consistent <= epoch and 0 <= value(body, "tidemark_driver_consistent_lag_seconds", **pipeline) < 30
    # Two writers in one process: their own registries, one server on the port they were given, and
    # /healthz is 200 while either loop runs.
    assert value(body, "tidemark_driver_leader", tidemark_job="down") == 1
    assert value(body, "tidemark_driver_epoch_phase_duration_seconds_count", phase="wait", tidemark_job="down") > 0
    assert not any(("tidemark_job", "down") in key for key in samples(scraped.up_registry))
    assert scraped.health == [200, 200, 503]


def test_the_exporter_serves_the_topology_view_per_job_and_table(scraped):
    body, at = scraped.exporter, scraped.exporter_at
    assert value(body, "tidemark_up") == 1 and value(body, "tidemark_jobs") == 2
    assert value(body, "tidemark_exporter_view_age_seconds") < 10
    for job in ("up", "down"):
        labels = {"tidemark_job": job}
        epoch = value(body, "tidemark_job_committed_epoch_timestamp_seconds", **labels)
        assert 0 <= value(body, "tidemark_job_lag_seconds", **labels) < 30 and abs(at - epoch) < 30
        assert value(body, "tidemark_job_leader_live", **labels) == 1
        assert value(body, "tidemark_job_stale", **labels) in (0, 1)  # lag-based: no timing assert on a busy machine
    assert value(body, "tidemark_job_term", tidemark_job="up") == 5
    tables = {dict(k[1:])["table"]: v for k, v in samples(body).items()
              if k[0] == "tidemark_table_committed_epoch_timestamp_seconds"}
    assert sorted(t.rsplit(".", 1)[1] for t in tables) == ["down", "up"]
    # The newest epoch both tables hold: down's epochs are epochs up holds, so at most down's newest.
    assert value(body, "tidemark_job_pipeline", tidemark_job="up", tidemark_pipeline="down") == 1
    assert value(body, "tidemark_job_pipeline", tidemark_job="down", tidemark_pipeline="down") == 1
    consistent = value(body, "tidemark_consistent_epoch_timestamp_seconds", tidemark_pipeline="down")
    assert consistent <= min(tables.values())
    assert 0 <= value(body, "tidemark_consistent_lag_seconds", tidemark_pipeline="down") < 30
    assert value(body, "tidemark_job_consistent_epoch_timestamp_seconds", tidemark_job="down") == consistent
    bounding = [j for j in ("up", "down") if value(body, "tidemark_job_bounds_consistent_epoch", tidemark_job=j) == 1]
    assert bounding and all(value(body, "tidemark_job_committed_epoch_timestamp_seconds", tidemark_job=j)
                            == min(tables.values()) for j in bounding)
    assert value(body, "tidemark_barrier_interval_seconds") == INTERVAL / 1000
    for job in ("up", "down"):  # neither has a cadence of its own: both follow the grid
        assert value(body, "tidemark_job_cadence_seconds", tidemark_job=job) == INTERVAL / 1000
        assert value(body, "tidemark_job_effective_cadence_seconds", tidemark_job=job) == INTERVAL / 1000
    assert "tidemark_job_paced_by" in series_names(body)  # documented, with no series: nobody follows
    assert not any(key[0] == "tidemark_job_paced_by" for key in samples(body))
    assert not series_names(body) & {"tidemark_job_pending_barriers", "tidemark_newest_barrier_timestamp_seconds"}


def test_every_series_passes_the_naming_lint(scraped):
    for name, body in (("drivers", scraped.drivers), ("exporter", scraped.exporter)):
        assert lint_exposition(body) == [], name


def test_the_lint_catches_what_breaks_the_conventions():
    bad = "\n".join([
        "# HELP tidemark_job_lag_ms lag", "# TYPE tidemark_job_lag_ms gauge", 'tidemark_job_lag_ms{job="a"} 5',
        "# HELP tidemark_epoch_timestamp_seconds t", "# TYPE tidemark_epoch_timestamp_seconds gauge",
        "tidemark_epoch_timestamp_seconds 1.795e+12",
        "# HELP tidemark_Commits_total c", "# TYPE tidemark_Commits_total gauge", "tidemark_Commits_total 1",
        "# HELP tidemark_job_cadence c",
        "# TYPE tidemark_job_cadence gauge", 'tidemark_job_cadence{tidemark_job="a"} 5',
        "# HELP tidemark_jobs j", "# TYPE tidemark_jobs gauge", "tidemark_jobs 1",
        "# HELP tidemark_jobs j", "# TYPE tidemark_jobs gauge", "tidemark_jobs 2", ""])
    problems = "\n".join(lint_exposition(bad))
    for expected in ("base units", "clashes with the scrape target", "not a Unix timestamp in seconds",
                     "snake_case", "only counters end in _total", "tidemark_jobs: the family appears 2 times",
                     "tidemark_job_cadence (gauge): a time must be in seconds"):
        assert expected in problems, expected


def promql_selectors(expr: str) -> set[str]:
    """Every metric name an expression selects, through the real PromQL parser."""
    import promql_parser
    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(present(node.name))
            return
        for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)
    walk(promql_parser.parse(expr))
    return names


def grafana_queries(dashboard: dict) -> list[str]:
    """Every PromQL query of the dashboard: panel targets (rows included) and query variables."""
    queries: list[str] = []

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))
    for panel in panels(dashboard["panels"]):
        queries += [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def as_promql(query: str) -> str:
    """Grafana's variables and ``label_values(...)`` replaced by what Prometheus would get."""
    import re
    if query.startswith("label_values("):
        inner = query[len("label_values("):-1]
        query = inner.rsplit(",", 1)[0] if "," in inner else inner
    query = query.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$__interval", "1m")
    return re.sub(r"\$\{?(\w+)(:\w+)?\}?", ".*", query)


def lost_keys(original, decoded, path: str = "") -> list[str]:
    """Keys of ``original`` missing from ``decoded`` (what a decoder did not understand), recursively."""
    if isinstance(original, dict) and isinstance(decoded, dict):
        return [lost for key, inner in original.items()
                for lost in ([f"{path}/{key}"] if key not in decoded
                             else lost_keys(inner, decoded[key], f"{path}/{key}"))]
    if isinstance(original, list) and isinstance(decoded, list):
        return [lost for i, (a, b) in enumerate(zip(original, decoded)) for lost in lost_keys(a, b, f"{path}[{i}]")]
    return []


def test_the_dashboard_loads_into_grafanas_dashboard_model():
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard
    dashboard = json.loads(DASHBOARD.read_text())
    decoded = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))
    assert lost_keys(dashboard, decoded) == [], "keys Grafana's dashboard schema does not know"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["type"] in ("row", "stat", "timeseries", "table"), panel["type"]
        assert panel["type"] == "row" or (panel["datasource"]["uid"] == "${datasource}" and panel["targets"])


def test_every_dashboard_query_names_a_series_the_exporter_or_the_drivers_export(scraped):
    dashboard = json.loads(DASHBOARD.read_text())
    exported = series_names(scraped.drivers) | series_names(scraped.exporter)
    queries = grafana_queries(dashboard)
    assert len(queries) >= 10
    named: set[str] = set()
    for query in queries:
        selectors = promql_selectors(as_promql(query))
        assert selectors, f"query names no metric: {query}"
        assert selectors <= exported, f"{query}: {sorted(selectors - exported)} are not exported"
        named |= selectors
    for needed in ("tidemark_table_lag_seconds", "tidemark_consistent_lag_seconds",
                   "tidemark_driver_epoch_phase_duration_seconds_bucket", "tidemark_driver_epochs_committed_total",
                   "tidemark_job_leader_live", "tidemark_job_term", "tidemark_job_effective_cadence_seconds"):
        assert needed in named, f"the dashboard shows no {needed}"
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36


def test_the_alert_rules_are_valid_and_query_real_series(scraped):
    rules = yaml.safe_load(RULES.read_text())
    exported = series_names(scraped.drivers) | series_names(scraped.exporter)
    alerts = {}
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule
            selectors = promql_selectors(rule["expr"])
            assert selectors and selectors <= exported, f"{rule['alert']}: {sorted(selectors - exported)}"
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            alerts[rule["alert"]] = rule
    for needed in ("TidemarkJobStale", "TidemarkJobLagHigh", "TidemarkConsistentLagHigh", "TidemarkExporterDown"):
        assert needed in alerts, needed


def firing(rule: dict, series: Series) -> list[str]:
    return returned(rule, series)


def test_the_lag_alerts_scale_with_each_jobs_effective_cadence():
    """An hourly job 30 minutes behind is on time; a 5-second job 6 minutes behind is not, nor an hourly job
    2.5 hours behind; a job at rest is no alert however far behind. Barrier backlog plays no part (there is none
    any more)."""
    rules = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    target = {"instance": "tidemark-exporter:9464", "job": "tidemark-exporter"}

    def per_job(values: dict[str, float]) -> list[Sample]:
        return [({**target, "tidemark_job": job}, float(v)) for job, v in values.items()]
    jobs = {  # lag (s), effective cadence (s), live (0: at rest, finished or paused or retired)
        "hourly": (1800, 3600, 1), "hourly_stuck": (9000, 3600, 1), "follows_hourly": (2000, 3600, 1),
        "fast": (360, 5, 1), "fast_ok": (12, 5, 1), "backfill_done": (90000, 5, 0), "daily_retired": (9e5, 86400, 0)}
    series = {"tidemark_job_lag_seconds": per_job({j: v[0] for j, v in jobs.items()}),
              "tidemark_job_effective_cadence_seconds": per_job({j: v[1] for j, v in jobs.items()}),
              "tidemark_job_live": per_job({j: v[2] for j, v in jobs.items()})}
    lag_high = rules["TidemarkJobLagHigh"]
    assert "tidemark_job_effective_cadence_seconds" in promql_selectors(lag_high["expr"])
    assert firing(lag_high, series) == ["fast", "hourly_stuck"]

    # Per pipeline: the fast one's threshold is its own jobs' (a job of it at rest widens nothing), the hourly one's
    # its hourly job's; neither pipeline's widens the other's.
    consistent = rules["TidemarkConsistentLagHigh"]
    pipeline_of = {"a": "fast", "b": "fast", "hourly_at_rest": "fast", "hourly": "slow", "follows_hourly": "slow"}
    cadences = {"a": 5.0, "b": 5.0, "hourly_at_rest": 3600.0, "hourly": 3600.0, "follows_hourly": 3600.0}

    def two_pipelines(fast_lag: float, slow_lag: float) -> dict[str, list[Sample]]:
        return {"tidemark_job_effective_cadence_seconds": per_job(cadences),
                "tidemark_job_live": per_job({j: 0 if j == "hourly_at_rest" else 1 for j in cadences}),
                "tidemark_job_pipeline": [({**target, "tidemark_job": j, "tidemark_pipeline": p}, 1.0)
                                          for j, p in pipeline_of.items()],
                "tidemark_consistent_lag_seconds": [({**target, "tidemark_pipeline": "fast"}, fast_lag),
                                                    ({**target, "tidemark_pipeline": "slow"}, slow_lag)]}
    assert firing(consistent, two_pipelines(300, 1800)) == []  # an hourly job bounds slow: 30 minutes is on time
    assert firing(consistent, two_pipelines(1800, 1800)) == ["fast"]  # the hourly pipeline widens nothing of fast's
    assert firing(consistent, two_pipelines(300, 9000)) == ["slow"]  # 2.5 hours behind: two cadences + 10 min
    for rule in rules.values():
        assert not {"tidemark_job_pending_barriers", "tidemark_newest_barrier_timestamp_seconds"} & \
            promql_selectors(rule["expr"]), rule["alert"]
        assert "barrier interval" not in rule["annotations"]["description"], rule["alert"]


def test_the_exporter_answers_tidemark_up_0_within_2_s_with_zookeeper_stopped(tmp_path):
    """The `tidemark exporter` command on its own ZooKeeper: down at start, up, stopped, back."""
    zk = EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path / "zk")
    port = free_port()
    exporter = subprocess.Popen(
        [*TIDEMARK, "--zk", f"{zk.connect_string}/tm", "--timeout", "2",
         "exporter", "--port", str(port), "--address", "127.0.0.1", "--refresh", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def timed_scrape() -> str:
        started = time.monotonic()
        status, body = scrape(port, timeout=2)
        assert status == 200 and time.monotonic() - started < 2, "a scrape took more than 2 s"
        return body

    def up_is(expected: int):
        return lambda: value(timed_scrape(), "tidemark_up") == expected

    def serving() -> bool:
        if exporter.poll() is not None:
            pytest.fail(f"the exporter exited: {present(exporter.stderr).read()}")
        try:
            return scrape(port, timeout=2)[0] == 200
        except OSError:
            return False

    try:
        wait_for(serving, "the exporter to serve")
        assert value(timed_scrape(), "tidemark_up") == 0  # no ZooKeeper yet: up 0, not an error
        assert scrape(port, "/healthz", timeout=2)[0] == 200
        zk.start()
        with Tidemark.connect(f"{zk.connect_string}/tm") as tm:
            tm.register_job("solo", sources=[], sinks=["lake.db.solo"])
        wait_for(lambda: ("tidemark_job_leader_live", ("tidemark_job", "solo")) in samples(timed_scrape()),
                 "the exporter's view of the registered job once ZooKeeper runs", timeout=60)
        body = timed_scrape()
        assert value(body, "tidemark_up") == 1 and value(body, "tidemark_job_leader_live", tidemark_job="solo") == 0
        zk.stop()
        stopped = time.monotonic()
        wait_for(up_is(0), "tidemark_up 0 with ZooKeeper stopped", timeout=30)
        assert time.monotonic() - stopped < 10
        body = timed_scrape()  # the last view, with its age
        assert value(body, "tidemark_job_stale", tidemark_job="solo") == 1
        assert value(body, "tidemark_exporter_view_age_seconds") >= 0
        assert scrape(port, "/healthz", timeout=2)[0] == 200
        zk.start()
        wait_for(up_is(1), "tidemark_up 1 once ZooKeeper is back", timeout=60)
    finally:
        exporter.terminate()
        exporter.wait(20)
        zk.stop()
    errors = present(exporter.stderr).read()
    assert exporter.returncode == 0 and "Traceback" not in errors, errors


def test_the_rule_evaluator_follows_prometheus_semantics():
    """The evaluator the idle-time test relies on: ``for`` (pending, then firing, reset by one evaluation that does
    not return the sample), label matchers, ``absent``, ``increase``/``rate`` and ``sum by``."""
    rules = {"groups": [{"name": "g", "rules": [
        {"alert": "Down", "expr": "up == 0", "for": "2m"},
        {"alert": "Absent", "expr": "absent(up)"},
        {"alert": "Fenced", "expr": "increase(fencings_total[30m]) > 2"},
        {"alert": "Retrying", "expr": 'sum by (tidemark_job) (rate(retries_total{op!="x"}[5m])) > 1'}]}]}
    evaluator = RuleEvaluator(rules)
    job = {"tidemark_job": "a", "instance": "d:9465"}
    for t in range(0, 601, 60):
        series: Series = {"fencings_total": [(job, float(t // 120))],
                          "retries_total": [({**job, "op": "zk"}, 2.0 * t), ({**job, "op": "x"}, 100.0 * t)]}
        if t != 180:  # one evaluation where up is 1 again: Down starts over
            series["up"] = [({}, 0.0 if t <= 540 else 1.0)]
        evaluator.evaluate(t, series)
    # fencings_total is t // 120: 3 more than at 0 s by 360 s; retries grow 2 per second (op x's are not counted).
    assert evaluator.fired == {("Down", "*"): 120, ("Absent", "*"): 180, ("Fenced", "a"): 360,
                               ("Retrying", "a"): 60}
    assert ("Down", "*") not in evaluator.active  # up is 1 again at the last evaluation
    assert returned({"alert": "R", "expr": 'sum by (tidemark_job) (rate(retries_total{op="x"}[5m]))'},
                    series, evaluator.history, 600) == ["a"]


IDLE_STEP_S = 30  # the rule evaluation interval of the idle-time test (Prometheus' default is 1m)


def test_a_bounded_run_then_idle_time_raises_no_alert_with_the_shipped_rules(zk_server, catalog_settings, capsys):
    """The issue's report, replayed on real ZooKeeper and real writers, then judged by the shipped rule file.

    Job ``stream`` (a root job) feeds ``batch`` (``run(max_epochs=3)``, then one ``run(once=True)``), ``old`` and
    ``quit``; afterwards ``stream`` is paused and ``old`` retired with the CLI, and ``quit`` is stopped without a
    word. Every table then holds the same last epoch, so the consistent epoch of all of them exists and ages.
    The exporter is scraped over HTTP every 30 s of *simulated* idle time: its clock (the view's read time and
    the lags) runs ahead of the wall clock, since nothing changes in ZooKeeper meanwhile and waiting an hour of
    real time would be the only difference. First a control: ``quit``, stopped without a word, must raise
    TidemarkJobStale after 3 minutes, TidemarkJobLagHigh and TidemarkConsistentLagHigh later. Then ``quit`` is
    paused too, and an hour of idle time (3 minutes included) must return nothing from any rule, not even a
    pending alert.
    """
    from coordinator.operations.cli import main as cli_main
    chroot = f"{zk_server.connect_string}/t-idle-{uuid.uuid4().hex[:6]}"
    sessions = [Tidemark.connect(chroot, session_timeout=4.0, operation_timeout=20) for _ in range(5)]
    tm = sessions[0]
    namespace = "ns_" + uuid.uuid4().hex[:8]
    names = ("stream", "batch", "old", "quit")
    tables = {name: f"{catalog_settings.name}.{namespace}.{name}" for name in names}
    catalog = catalog_settings.load()
    for table in tables.values():
        create_table(catalog, catalog_settings.identifier(table))
    stream = tables["stream"]
    for name in names[1:]:  # the pipeline first: nobody reads stream's table by commit time
        tm.register_job(name, sources=[stream], sinks=[tables[name]])

    def writer(session: Tidemark, name: str) -> EpochWriter:
        sources = [] if name == "stream" else [stream]
        return EpochWriter(session, name, sources=sources, sinks=[tables[name]], catalog=catalog_settings,
                           interval_ms=INTERVAL, grace_ms=100)

    def step(name: str) -> Callable[[EpochContext], None]:
        def produce(ctx: EpochContext) -> None:
            ctx.append(stream, pa.table({"epoch": [ctx.epoch] * 2, "row": [0, 1]}, schema=SCHEMA))

        def copy(ctx: EpochContext) -> None:
            ctx.append(tables[name], ctx.changes(stream))
        return produce if name == "stream" else copy

    offset = [0.0]  # seconds the exporter's clock runs ahead of the wall clock: the simulated idle time
    exporter = Exporter(lambda: Tidemark.connect(chroot, read_only=True, operation_timeout=5), refresh_every=3600,
                        clock=lambda: time.time() + offset[0]).start()  # refreshed below, at each evaluation
    server = MetricsServer(0, "127.0.0.1")
    server.attach(exporter.registry, healthy=exporter.alive)
    target = {"instance": f"127.0.0.1:{server.port}", "job": "tidemark-exporter"}
    running: dict[str, InBackground] = {}
    try:
        running = {name: InBackground(writer(sessions[i], name), step(name))
                   for i, name in enumerate(("stream", "old", "quit"), start=1)}
        batch = writer(sessions[4], "batch")
        assert len(batch.run(step("batch"), max_epochs=3, stop_on_sigterm=False)) == 3  # the bounded run
        wait_for(lambda: running["stream"].writer.committed[-1] > batch.committed[-1], "a stream epoch after batch's")
        running["stream"].stop()
        last = present(tm.tidemarks([stream])[stream]).epoch
        assert batch.run(step("batch"), once=True, stop_on_sigterm=False) == [last]  # a batch run: caught up
        def caught_up(name: str) -> bool:
            return running[name].writer.committed[-1:] == [last]
        for name in ("old", "quit"):
            wait_for(partial(caught_up, name), f"{name} to commit {last}")
            running[name].stop()
        assert cli_main(["--zk", chroot, "pause", "stream", "--reason", "maintenance", "--yes"]) == 0
        assert cli_main(["--zk", chroot, "retire", "old", "--reason", "replaced by quit", "--yes"]) == 0
        status = tm.status()
        assert {j.name: j.state for j in status.jobs} == {"batch": "finished", "old": "retired", "quit": "no leader",
                                                          "stream": "paused"}
        assert status.consistent_epoch == status.live_consistent_epoch == last  # quit is live (and stale)

        def idle(minutes: int) -> RuleEvaluator:
            rules = RuleEvaluator(yaml.safe_load(RULES.read_text()))
            start = offset[0]
            for n in range(minutes * 60 // IDLE_STEP_S + 1):
                offset[0] = start + n * IDLE_STEP_S
                exporter.refresh()
                status_code, body = scrape(server.port)
                assert status_code == 200 and value(body, "tidemark_up") == 1
                rules.evaluate(n * IDLE_STEP_S, scraped_series(body, target))
            return rules

        control = idle(60)
        assert set(control.fired) == {("TidemarkJobStale", "quit"), ("TidemarkJobLagHigh", "quit"),
                                      ("TidemarkConsistentLagHigh", "batch")}, control.fired
        assert control.fired[("TidemarkJobStale", "quit")] == 180  # stale from the start, `for: 3m`
        # Lag over 2 x 0.5 s + 300 s for 5 minutes; consistent lag over 2 x 0.5 s + 600 s for 5 minutes.
        assert 600 <= control.fired[("TidemarkJobLagHigh", "quit")] <= 600 + 2 * IDLE_STEP_S
        assert 900 <= control.fired[("TidemarkConsistentLagHigh", "batch")] <= 900 + 2 * IDLE_STEP_S

        capsys.readouterr()
        assert cli_main(["--zk", chroot, "pause", "quit", "--yes"]) == 0
        quiet = idle(60)
        assert quiet.returned == set(), f"alerts after a bounded run and idle time: {sorted(quiet.returned)}"
        body = quiet.history[-1][1]
        assert "tidemark_consistent_lag_seconds" not in body  # no job is live: no freshness to report
        table_lags = {labels["tidemark_job"]: v for labels, v in body["tidemark_table_lag_seconds"]}
        assert set(table_lags) == set(names) and min(table_lags.values()) > 2 * 3600  # each table's own truth
        states = {labels["tidemark_job"]: v for labels, v in body["tidemark_job_live"]}
        assert states == {name: 0.0 for name in names}
        text = capsys.readouterr().out
        assert "job quit paused until `tidemark resume`" in text
    finally:
        for job in running.values():
            job.writer.stop()
            job.thread.join(60)
        server.close()
        exporter.close()
        for session in sessions:
            session.close()
