"""The ``tidemark`` command: status and operations (docs/operations.md; every option: docs/reference/cli.md).

    tidemark --version | --help | COMMAND --help     every option of every command is explained there
    tidemark zk start [--port P] [--data-dir D]     a local ZooKeeper server in the background (zk status, zk stop)
    tidemark lakehouse start [--data-dir D]         a local S3 endpoint and REST catalog (lakehouse env, status, stop)
    tidemark init                                   create the tree's top-level znodes, secured for the identities
    tidemark status [--json]                        jobs, leaders, tidemarks, lag (s), cadence, what each job waits for
    tidemark topology [--format text|json|dot|mermaid]
    tidemark fence JOB [--yes] [--dry-run] | tidemark unregister JOB [--yes] [--dry-run] [--unfenced]
    tidemark pause JOB [--for 2h] [--reason R] | retire JOB [--reason R] | resume JOB   [--yes] [--dry-run]
    tidemark barriers [--json] [--set-interval MS --from T | --revert [--from T]] [--yes] [--dry-run]
                                                    the grid; per job its cadence and last epoch
    tidemark resolve TABLE... [--level ...] [--scope S] [--as-of T|tidemark-P-T] [--no-zk] [--json | --format sql]
    tidemark gc [--yes] [--dry-run] [--json] [--policy SPEC]  retained versions, snapshot expiry, file clean-up
                [--wait S] [--skip-if-running]      ... one run at a time: waits for another one (default 300 s)
                [--orphans [--older-than 3d]]       ... and files no metadata references (listed; daily is enough)
    tidemark versions [--json]                      the retained versions, with their tier and age
    tidemark exporter [--port 9464] [--refresh S]   the topology-wide view for Prometheus, /metrics and /healthz
    tidemark serve [--host H] [--port 8181]         a read-only Iceberg REST catalog of consistent versions

Errors print one line, ``tidemark: error: ...``, and exit with status 1 (2 for a malformed command line; output
into a closed pipe ends quietly with 141). Commands that change shared state say what they would do and ask
(without a terminal: ``--yes``; ``--dry-run`` only says it). ZooKeeper credentials come from the environment only.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import shlex
import signal
import socket
import sys
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

from coordinator.errors import TidemarkError
from coordinator.formatting import fmt_age, fmt_duration, fmt_epoch, fmt_every, fmt_seconds, fmt_time
from coordinator.operations.logs import logging_to_stderr
from coordinator.operations.zookeeper_server import DEFAULT_PORT, EmbeddedZooKeeper, four_letter_word
from coordinator.protocol.barriers import (
    CHANGE_LEAD_MS,
    MAX_INTERVAL_MS,
    check_grid_request,
    preview_grid_request,
)
from coordinator.serving.credentials import DEFAULT_DURATION_S as DEFAULT_STS_DURATION_S
from coordinator.serving.credentials import Vending
from coordinator.serving.hold import DEFAULT_MAX_HOLD_MS, DEFAULT_QUERY_GAP_MS
from coordinator.serving.limits import DEFAULT_MAX_CONNECTIONS
from coordinator.uncaught import error_line

if TYPE_CHECKING:  # imported by the commands that use them: `tidemark --help` stays quick
    from pyiceberg.catalog import Catalog

    from coordinator.history.gc import GcPlan
    from coordinator.iceberg.catalog import CatalogSettings
    from coordinator.protocol.status import JobStatus, PipelineStatus, Status
    from coordinator.tidemark import Tidemark
    from coordinator.zookeeper.security import TlsSettings

EXIT_ERROR, EXIT_USAGE, EXIT_CLOSED_PIPE = 1, 2, 141
MIN_INTERVAL_MS = 100  # the library takes 1 ms (benchmarks); from the command line a tiny interval is a typo
EXPORTER_PORT = 9464  # tidemark exporter's default (the chart's too)


def _connect(args: argparse.Namespace, read_only: bool = False) -> Tidemark:
    """The session; commands that only read never create znodes (so they never leave any open to anyone)."""
    from coordinator.tidemark import Tidemark
    return Tidemark.connect(args.zk, root=args.root, connect_timeout=args.timeout, operation_timeout=args.timeout,
                            tls=_tls(args), read_only=read_only)


def _tls(args: argparse.Namespace) -> Optional[TlsSettings]:
    """TLS settings from the ``--tls-*`` options; None leaves it to the ``TIDEMARK_ZK_TLS*`` variables."""
    from coordinator.zookeeper.security import TlsSettings
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_key):
        return None
    env = TlsSettings.from_env() or TlsSettings()
    return TlsSettings(ca=args.tls_ca or env.ca, certfile=args.tls_cert or env.certfile,
                       keyfile=args.tls_key or env.keyfile, verify_certs=env.verify_certs,
                       check_hostname=env.check_hostname, keyfile_password=env.keyfile_password)


def _where(args: argparse.Namespace) -> str:
    """Where a command looked in ZooKeeper: an answer that found nothing says it, as a wrong chroot or root finds
    nothing too."""
    from coordinator.settings import Settings
    hosts, slash, chroot = (args.zk or Settings.from_env().zk_connect).partition("/")
    return f"ZooKeeper {hosts}, chroot {'/' + chroot if slash and chroot else '(none)'}, root {args.root}"


def _require_in_catalog(settings: CatalogSettings, tables: list[str], tm: Optional[Tidemark] = None,
                        catalog: Optional[Catalog] = None) -> None:
    """Refuse to go on when the catalog lacks one of ``tables``, or has other tables of those names than the jobs
    write (``check_table_identities``): ZooKeeper's records would otherwise answer for tables this catalog does not
    have (a wrong TIDEMARK_CATALOG_URI), and gc would collect nothing while dropping retained versions.
    ``catalog``: the one the command already opened (else it is opened here). The error says a table is registered
    in ZooKeeper only when a job writes or reads it there: a typo in ``tidemark resolve`` is not a catalog that
    lacks the jobs' tables."""
    from coordinator.errors import TableNotFound
    from coordinator.iceberg.catalog import load_table
    from coordinator.protocol.registry import check_table_identities
    if not tables:
        return  # nothing to check, and no catalog needed (a deployment that registered no table yet)
    catalog = catalog if catalog is not None else settings.load()
    missing, identities = [], {}
    for table in sorted(set(tables)):
        try:
            identities[table] = str(load_table(catalog, settings, table).metadata.table_uuid)
        except TableNotFound:
            missing.append(table)
    if not missing:
        if tm is not None:  # the tables are there: are they the ones the jobs write?
            check_table_identities(tm, identities, settings.describe())
        return
    writers: dict[str, str] = {}
    roots: set[str] = set()
    if tm is not None:  # registered names may carry the catalog's name (lake.db.t) or not: compare them without
        topology = tm.topology()
        writers = {settings.identifier(t): job for t, job in topology.writers.items()}
        roots = {settings.identifier(t) for t in topology.root_tables}
    registered = [t for t in missing if settings.identifier(t) in writers or settings.identifier(t) in roots]

    def named(table: str) -> str:
        writer = writers.get(settings.identifier(table))
        return table + (f" (written by job {writer})" if writer else "")
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    lacks = (f"{', '.join(map(named, missing[:5]))}{more} {'does' if len(missing) == 1 else 'do'} not exist in "
             f"{settings.describe()}")
    if not registered:
        raise TidemarkError(f"{lacks}: check the table names, or point TIDEMARK_CATALOG_URI (and "
                            "TIDEMARK_CATALOG_NAME) at the catalog that has them; nothing changed")
    if len(registered) == len(missing):
        which = "it is" if len(missing) == 1 else "they are"
    else:  # some registered, some not: only tables a command line names (resolve), so a few
        which = f"{', '.join(registered)} {'is' if len(registered) == 1 else 'are'}"
    raise TidemarkError(f"{lacks}, though {which} registered in ZooKeeper: point TIDEMARK_CATALOG_URI (and "
                        "TIDEMARK_CATALOG_NAME) at the catalog the jobs write, or create the table, or unregister a "
                        "job whose tables were dropped; nothing changed")


def _confirm(args: argparse.Namespace, plan: str, action: str) -> bool:
    """Before a change to shared state: with --dry-run print ``plan`` and return False; with --yes go ahead; on a
    terminal print it and ask; otherwise refuse in one line (a script must say --yes)."""
    if args.dry_run:
        print(f"{plan}\ndry run: nothing changed")
        return False
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise TidemarkError(f"{plan}; nothing changed: pass --yes to {action} (--dry-run shows this and changes "
                            "nothing)")
    print(plan)
    try:
        answer = input(f"{action[0].upper()}{action[1:]}? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise TidemarkError("not confirmed; nothing changed")
    return True


def cmd_zk(args: argparse.Namespace) -> int:
    from coordinator.settings import Settings
    settings = Settings.from_env()
    # With credentials configured, the local server refuses clients without any (--no-require-auth: it does not).
    require_auth = (args.require_auth if args.require_auth is not None
                    else bool(settings.zk_user or settings.zk_reader_user))
    server = EmbeddedZooKeeper(port=args.port or DEFAULT_PORT, data_dir=args.data_dir, require_auth=require_auth)
    if args.action == "start":
        running = server.running_state()
        if running is not None and args.port in (None, running.port):  # a second start says where it runs
            print(f"127.0.0.1:{running.port}")
            print(f"tidemark: a ZooKeeper server (pid {running.pid}) already runs there with data dir "
                  f"{server.data_dir}; `tidemark zk stop` stops it", file=sys.stderr)
            return 0
        server.start()
        print(server.connect_string)
        if require_auth:
            print("tidemark: the server refuses clients without credentials (TIDEMARK_ZK_USER or _READER_USER); "
                  "--no-require-auth lets them in", file=sys.stderr)
        return 0
    state = server.recorded_state()
    other_port = args.port is not None and state is not None and state.port != args.port
    if args.action == "stop":
        if other_port and state is not None:  # --port names another server than the one recorded here
            raise TidemarkError(f"the ZooKeeper server recorded in {server.data_dir} listens on port {state.port}, "
                                f"not {args.port}: nothing stopped. Pass --port {state.port}, or the --data-dir of "
                                f"the server on port {args.port}")
        print("stopped" if server.stop() else f"no ZooKeeper server recorded in {server.data_dir}")
        return 0
    reply = four_letter_word("127.0.0.1", state.port, b"srvr") or b"" if state is not None and not other_port else b""
    mode = next((line.split(":", 1)[1].strip() for line in reply.decode(errors="replace").splitlines()
                 if line.startswith("Mode:")), None)
    if args.json:
        print(json.dumps({"running": bool(reply), "pid": state.pid if state and not other_port else None,
                          "port": state.port if state else args.port, "data_dir": str(server.data_dir),
                          "mode": mode}, indent=2))
    elif state is None:
        print(f"not running (nothing recorded in {server.data_dir})")
    elif other_port:
        print(f"not running on port {args.port} (the server recorded in {server.data_dir} listens on {state.port})")
    else:
        print(f"pid {state.pid}, 127.0.0.1:{state.port}, data {state.data_dir}: "
              f"{'serving, Mode: ' + str(mode) if reply else 'NOT answering'}")
    return 0 if reply else 3


def cmd_lakehouse(args: argparse.Namespace) -> int:
    from coordinator.operations.lakehouse_server import EmbeddedLakehouse, disk_room
    from coordinator.settings import Settings
    settings = Settings.from_env()
    server = EmbeddedLakehouse(args.data_dir or settings.home / "lakehouse", catalog_name=settings.catalog_name)
    pid = server.running_pid()
    if args.action == "start" and pid is not None:  # a second terminal or a notebook gets the settings again
        print(f"tidemark: the lakehouse server (pid {pid}) already runs with data dir {server.data_dir}; its "
              "settings follow (`tidemark lakehouse stop` stops it)", file=sys.stderr)
    elif args.action == "start":
        server.start()
    elif args.action == "stop":
        print("stopped" if server.stop() else f"no lakehouse server recorded in {server.data_dir}")
        return 0
    elif pid is None:
        if args.action == "env":  # eval would set nothing and a job would use the embedded catalog: say it
            raise TidemarkError(f"no lakehouse server runs with data dir {server.data_dir}: `tidemark lakehouse "
                                "start` starts one and prints its settings")
        print(f"not running (no live server recorded in {server.data_dir})")
        return 3
    if args.action in ("start", "env"):
        for variable, value in server.pyiceberg_environment().items():
            print(f"export {variable}={shlex.quote(value)}")
        return 0
    serving, room = server.serving(), disk_room(server.data_dir)
    print(f"pid {pid}, S3 {server.s3_endpoint}, catalog {server.catalog_uri}, data {server.data_dir}: "
          f"{'serving' if serving else 'NOT answering'}"
          f"{'' if room.enough else f', but NOT writing: {room.describe()}'}")
    print('its settings, for another terminal or a notebook: eval "$(tidemark lakehouse env)"')
    return 0 if serving and room.enough else 3


def cmd_init(args: argparse.Namespace) -> int:
    with _connect(args) as tm:
        print(f"tree ready in {_where(args)}, as {tm.credentials.identity}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with _connect(args, read_only=True) as tm:
        status = tm.status()
    if args.json:
        print(json.dumps(status.to_dict(), indent=2))
        return 0
    print(f"grid: {status.interval_ms or '-'} ms   pipelines: {len(status.pipelines)}")
    if not status.jobs:
        print(f"no jobs registered (looked in {_where(args)})")
    jobs = {job.name: job for job in status.jobs}
    for pipeline in status.pipelines:
        print(_pipeline_line(pipeline, [jobs[name] for name in pipeline.jobs]))
        for job in (jobs[name] for name in pipeline.jobs):
            print(_job_line(job))
            for table, epoch in sorted(job.tidemarks.items()):
                print(f"    {table}: {fmt_epoch(epoch)}")
            if job.consistent_epoch != job.committed_epoch and job.committed_epoch is not None:
                print(f"    consistent with its sources at {fmt_epoch(job.consistent_epoch)}")
            for reason in job.reasons():
                print(f"    {reason}")
    return 0


def _pipeline_line(pipeline: PipelineStatus, jobs: list[JobStatus]) -> str:
    """A pipeline's headline: its consistent epoch, and without its jobs at rest, or which of its jobs hold it back."""
    def consistent(epoch: Optional[int], lag_ms: Optional[int]) -> str:
        return ("none (no epoch that every one of its tables holds)" if epoch is None
                else f"{fmt_epoch(epoch)}, lag {fmt_seconds(lag_ms)}")
    line = (f"pipeline {pipeline.name} ({len(pipeline.jobs)} {'job' if len(pipeline.jobs) == 1 else 'jobs'}): "
            f"consistent epoch {consistent(pipeline.consistent_epoch, pipeline.consistent_lag_ms)}")
    at_rest = [job.name for job in jobs if job.at_rest]
    if at_rest and len(at_rest) < len(jobs):  # then the tables of the jobs that run may be fresher
        line += (f"   without the jobs at rest ({', '.join(at_rest)}): "
                 f"{consistent(pipeline.live_consistent_epoch, pipeline.live_consistent_lag_ms)}")
    if pipeline.stale_jobs:
        line += f"   held back by {', '.join(pipeline.stale_jobs)}"
    return line


def _job_line(job: JobStatus) -> str:
    from coordinator.protocol.status import FINISHED
    leader = f"{job.leader.member} (term {job.leader.term})" if job.leader else "-"
    mark = job.retired or job.paused
    if job.state == FINISHED and job.finished is not None:
        head = f"{job.name}: term {job.term}, finished at epoch {fmt_epoch(job.finished.epoch)}"
    elif job.at_rest and mark is not None:
        head = (f"{job.name}: term {job.term}, {job.state} by {mark.by}" + (f" ({mark.reason})" if mark.reason else "")
                + (f" until {fmt_time(mark.until_ms)}" if mark.until_ms else "")
                + f", committed {fmt_epoch(job.committed_epoch)}")
    else:
        head = f"{job.name}: term {job.term}, {job.leader_state}: {leader}, committed {fmt_epoch(job.committed_epoch)}"
    line = ", ".join([head, f"lag {fmt_seconds(job.lag_ms)}", job.describe_cadence()])
    if job.stale:
        line += f"  STALE: {job.stale_reason}"
        if job.holds_back_ms is not None:
            line += f"; holds its pipeline's consistent epoch back {fmt_seconds(job.holds_back_ms)}"
        elif job.committed_epoch is None:
            line += "; no consistent epoch until it commits"
    return line


def cmd_topology(args: argparse.Namespace) -> int:
    with _connect(args, read_only=True) as tm:
        topo = tm.topology()
    render = {"text": topo.to_text, "dot": topo.to_dot, "mermaid": topo.to_mermaid,
              "json": lambda: json.dumps(topo.to_dict(), indent=2)}
    form = "json" if args.json else args.format
    print(f"no jobs registered (looked in {_where(args)})" if form == "text" and not topo.jobs else render[form]())
    return 0


def cmd_fence(args: argparse.Namespace) -> int:
    from coordinator.errors import JobNotFound
    with _connect(args, read_only=args.dry_run) as tm:
        job = next((j for j in tm.status().jobs if j.name == args.job), None)
        if job is None:
            raise JobNotFound(f"job {args.job!r} is not registered (looked in {_where(args)}): `tidemark status` "
                              "lists the jobs")
        leader = f"its leader {job.leader.member}" if job.leader else "a leader that comes back"
        plan = (f"fence job {args.job}: its term goes from {job.term} to {(job.term or 0) + 1}, so {leader} can no "
                "longer commit; a standby, or a driver started again, leads with the new term")
        if not _confirm(args, plan, f"fence job {args.job}"):
            return 0
        term = tm.fence_job(args.job, by=args.by)
    print(f"job {args.job} fenced: term is now {term}; its old leader can no longer commit")
    return 0


def cmd_unregister(args: argparse.Namespace) -> int:
    from coordinator.errors import UnregisterNotConfirmed
    from coordinator.iceberg.catalog import CatalogSettings
    catalog = CatalogSettings.from_env()
    with _connect(args) as tm:
        try:
            plan = tm.unregister_job(args.job, confirm=args.yes and not args.dry_run, catalog=catalog,
                                     allow_unfenced=args.unfenced)
        except UnregisterNotConfirmed as refused:
            if args.dry_run:
                print(f"{refused.plan.describe()}\ndry run: nothing changed")
                return 0
            if not sys.stdin.isatty():
                raise TidemarkError(f"{refused.plan.describe()}; nothing changed: pass --yes to unregister") from None
            print(refused.plan.describe())
            if input(f"Type the job name ({args.job}) to unregister it: ").strip() != args.job:
                raise TidemarkError("not confirmed; nothing changed") from None
            plan = tm.unregister_job(args.job, confirm=True, catalog=catalog, allow_unfenced=args.unfenced)
    print(f"job {args.job} unregistered (it wrote {', '.join(plan.record.sinks)}). "
          + (plan.resume.describe() if plan.resume is not None else "Its sinks' Iceberg progress is unknown."))
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from coordinator.iceberg.catalog import CatalogSettings
    catalog = CatalogSettings.from_env()
    with _connect(args, read_only=args.dry_run) as tm:
        terms = tm.release_tables(args.tables, catalog=catalog)
        plan = (f"release {', '.join(sorted(terms))}: readers with ZooKeeper will read them by their Iceberg records, "
                "and their old writer's leaders can no longer commit to them")
        if not _confirm(args, plan, "release them"):
            return 0
        terms = tm.release_tables(args.tables, catalog=catalog, confirm=True)
    for table, term in sorted(terms.items()):
        print(f"table {table} released (claimed for term {term}): readers with ZooKeeper read it by its Iceberg "
              "records")
    return 0


def cmd_rest(args: argparse.Namespace) -> int:
    """``pause``, ``retire`` and ``resume`` (``coordinator.protocol.rest``)."""
    from coordinator.errors import ConfigurationError
    from coordinator.protocol.pacing import parse_every
    from coordinator.records import now_ms
    try:
        for_ms = parse_every(args.duration) if args.command == "pause" else None
    except ConfigurationError:
        raise ConfigurationError(f"--for must be a positive duration such as 30m, 2h or 1d, got {args.duration!r}"
                                 ) from None
    doing = {"pause": f"pause job {args.job}" + (f" for {fmt_every(for_ms)}" if for_ms else " until resumed"),
             "retire": f"retire job {args.job}", "resume": f"resume job {args.job}"}[args.command]
    plan = {"pause": f"{doing}: while no leader runs it, it is not stale and its tables leave the consistent lag",
            "retire": f"{doing}: its tables stay readable at their last epoch; its drivers refuse to lead it until "
                      "`tidemark resume`",
            "resume": f"{doing}: with no live leader it is stale again"}[args.command]
    if not _confirm(args, plan, doing):
        return 0
    with _connect(args) as tm:
        if args.command == "pause":
            record = tm.pause_job(args.job, by=args.by, reason=args.reason,
                                  until_ms=None if for_ms is None else now_ms() + for_ms)
            until = "until `tidemark resume`" if record.until_ms is None else f"until {fmt_time(record.until_ms)}"
            print(f"job {args.job} paused {until}: while no leader runs it, it is not stale and its tables leave "
                  "the consistent lag")
        elif args.command == "retire":
            tm.retire_job(args.job, by=args.by, reason=args.reason)
            print(f"job {args.job} retired: its tables stay readable at their last epoch, it is not stale and "
                  f"leaves the consistent lag; its drivers refuse to lead it until `tidemark resume {args.job}`")
        else:
            removed = tm.resume_job(args.job)
            print(f"job {args.job} was not paused or retired; nothing changed" if removed is None else
                  f"job {args.job} resumed (it was {removed}): with no live leader it is stale again")
    return 0


def cmd_barriers(args: argparse.Namespace) -> int:
    """The grid, and per job its cadence, the cadence it follows and its last epoch; ``--set-interval`` changes
    the grid's interval at a future grid point, unless a job's cadence would stop being a multiple of it;
    ``--revert`` cancels a change that has not taken effect yet. Both say what they would do and ask first; what
    a valid request is, ``check_grid_request`` and ``preview_grid_request`` say."""
    from coordinator.records import now_ms
    changing = check_grid_request(args.set_interval, args.effective_from, args.revert)
    with _connect(args, read_only=not changing or args.dry_run) as tm:
        status = tm.status()
        if status.grid is None:
            raise TidemarkError(f"no barrier grid is defined yet (looked in {_where(args)}): a job's first run "
                                "defines it (EpochWriter(interval_ms=...), or the job command's --interval-ms)")
        if changing:
            current, now = status.grid, now_ms()
            # Refused before anyone is asked, as change_interval or revert_changes would refuse it.
            changes = preview_grid_request(tm.barriers, current, now, args.set_interval, args.effective_from,
                                           args.revert)
            if args.revert:
                plan = "cancel the pending interval change" + ("s " if len(changes) > 1 else " ") + ", ".join(
                    f"to {c['interval_ms']} ms at {fmt_epoch(c['from_epoch'])}" for c in changes)
                if not _confirm(args, plan, "cancel it"):
                    return 0
                tm.barriers.revert_changes(args.effective_from)
            else:
                plan = (f"change the barrier interval of every job from {current.interval_at(args.effective_from - 1)} "
                        f"ms to {args.set_interval} ms at {fmt_epoch(args.effective_from)}, in "
                        f"{fmt_duration(args.effective_from - now)} (`tidemark barriers --revert` cancels it until "
                        "then)")
                if not _confirm(args, plan, "change the interval"):
                    return 0
                tm.barriers.change_interval(args.set_interval, args.effective_from)
            status = tm.status()
    _print_barriers(args, status)
    return 0


def _print_barriers(args: argparse.Namespace, status: Status) -> None:
    """``tidemark barriers``' output: the grid, its changes, and each job's cadence and last epoch."""
    grid = status.grid
    assert grid is not None
    next_point = grid.next_candidate(status.read_ms)
    if args.json:
        print(json.dumps({"grid": grid.to_dict(), "interval_ms": status.interval_ms,
                          "pending": list(grid.pending(status.read_ms)), "next_grid_point": next_point,
                          "grid_point": grid.floor(status.read_ms),
                          "jobs": [{"name": j.name, "cadence_ms": j.cadence_ms,
                                    "effective_cadence_ms": j.effective_cadence_ms, "cadence_from": j.cadence_from,
                                    "last_epoch": j.committed_epoch} for j in status.jobs]}, indent=2))
        return
    print(f"grid: every {grid.interval_ms} ms from epoch 0 ({grid.mode.value}); in force now: "
          f"{status.interval_ms} ms; newest grid point the clock passed: {fmt_epoch(grid.floor(status.read_ms))}")
    for change in grid.changes:
        pending = "  pending: `tidemark barriers --revert` cancels it" if change["from_epoch"] > status.read_ms else ""
        print(f"  every {change['interval_ms']} ms from {fmt_epoch(change['from_epoch'])}{pending}")
    if next_point - status.read_ms > MAX_INTERVAL_MS:
        print(f"the grid's next point is {fmt_epoch(next_point)}: no job takes an epoch until then. To leave it, "
              f"`tidemark barriers --set-interval MS --from T` (for 5000 ms the earliest T is "
              f"{grid.earliest_change(5000, status.read_ms)})")
    if not status.jobs:
        print(f"no jobs registered (looked in {_where(args)})")
    for job in status.jobs:
        print(f"{job.name}: {job.describe_cadence()}, last epoch {fmt_epoch(job.committed_epoch)}")


def cmd_resolve(args: argparse.Namespace) -> int:
    from coordinator.history.resolve import Resolver
    from coordinator.iceberg.catalog import CatalogSettings
    settings = CatalogSettings.from_env()
    tm = None if args.no_zk else _connect(args, read_only=True)
    try:
        catalog = settings.load()
        if tm is not None:  # without ZooKeeper the resolver loads every table anyway
            _require_in_catalog(settings, args.tables, tm, catalog)
        resolver = Resolver(catalog, settings, tm)
        version = resolver.resolve(args.tables, level=args.level, as_of=args.as_of, scope=args.scope)
    finally:
        if tm is not None:
            tm.close()
    if args.format == "sql":
        from coordinator.history.readers import version_sql
        print(f"-- {version.level.value} version, epoch {fmt_epoch(version.epoch)}")
        for statement in version_sql(resolver, version).values():
            print(f"{statement};")
    elif args.json:
        print(version.to_json().decode())
    else:
        print(f"level {version.level.value}, epoch {fmt_epoch(version.epoch)}")
        for table, snapshot in sorted(version.snapshots.items()):
            print(f"  {table}: {snapshot if snapshot is not None else '(empty)'}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from coordinator.errors import GcRunning
    from coordinator.history.gc import GarbageCollector, summarize
    from coordinator.history.retention import RetentionPolicy, store_policy
    from coordinator.iceberg.catalog import CatalogSettings
    policy = RetentionPolicy.parse(args.policy) if args.policy else None
    settings = CatalogSettings.from_env()
    with _connect(args) as tm:
        topology = tm.topology()
        collector = GarbageCollector(tm, settings, policy=policy)
        _require_in_catalog(settings, [*topology.writers, *topology.root_tables], tm, collector.catalog)
        if not args.dry_run and not args.yes:
            _confirm(args, _gc_plan(collector.plan(), args), "collect")
        try:
            with nullcontext() if args.dry_run else collector.exclusive(wait_s=args.wait):
                if policy is not None and not args.dry_run:
                    store_policy(tm, policy)
                report = collector.run(dry_run=args.dry_run)
                orphans = (collector.remove_orphan_files(args.older_than, dry_run=args.dry_run) if args.orphans
                           else None)
        except GcRunning as running:
            if not args.skip_if_running:
                raise
            print(f"skipped: {running}")
            return 0
    if args.json:
        out = report.to_dict()
        if orphans is not None:
            out["orphans"] = [o.to_dict() for o in orphans]
        print(json.dumps(out, indent=2))
        return 0
    print(("dry run: nothing changed\n" if report.dry_run else "") + "\n".join(summarize(report.plan)))
    if not report.dry_run:
        print(f"expired {report.expired_snapshots} snapshots, deleted {report.deleted_files} files")
    for found in orphans or []:
        verb = "would delete" if report.dry_run else "deleted"
        print(f"  table {found.table}: {verb} {len(found.paths)} orphan files ({found.size_bytes} bytes) "
              f"older than {fmt_age(args.older_than)}")
        for path in found.paths if report.dry_run else []:
            print(f"    {path}")
    return 0


def _gc_plan(plan: GcPlan, args: argparse.Namespace) -> str:
    """What a gc run is about to do, in one sentence, for its confirmation."""
    from collections import Counter
    actions = Counter(v.action for v in plan.versions)
    expired = sum(len(t.expire) for t in plan.tables)
    return (f"gc with the policy {plan.policy}: create {actions['create']} and drop {actions['drop']} retained "
            f"versions, expire {expired} snapshots of {len(plan.tables)} tables and delete their files"
            + (f"; record the policy {args.policy} for the deployment" if args.policy else "")
            + ("; then delete the files no metadata references" if args.orphans else ""))


def cmd_versions(args: argparse.Namespace) -> int:
    from coordinator.history.versions import RetainedVersions, tier_listing
    from coordinator.iceberg.catalog import CatalogSettings
    settings = CatalogSettings.from_env()
    with _connect(args, read_only=True) as tm:
        listing = tier_listing(tm, RetainedVersions(tm).all())
        topology = tm.topology()  # registered tables only: a table dropped since a version was retained is fine
        _require_in_catalog(settings, [*topology.writers, *topology.root_tables], tm)
    if args.json:
        print(json.dumps([entry.to_dict() for entry in listing], indent=2))
        return 0
    if not listing:
        print(f"no retained versions (looked in {_where(args)}; run `tidemark gc`)")
    heading: object = ()  # no pipeline yet (None is an earlier release's versions)
    for entry in listing:
        if entry.pipeline != heading:
            heading = entry.pipeline
            print(f"pipeline {entry.pipeline}:" if entry.pipeline
                  else "an earlier release's versions, across pipelines:")
        empty = f" ({len(entry.empty)} more empty then, untagged)" if entry.empty else ""
        covered = len(entry.snapshots) - len(entry.empty)
        where = (f"tagged in {len(entry.tagged)} tables{empty}" if entry.tag is not None else
                 f"untagged: read by snapshot id (--as-of {entry.epoch}), {covered} tables{empty}")
        print(f"  {entry.tag or entry.epoch}  {fmt_epoch(entry.epoch)}  age {fmt_age(entry.age_ms)}  {entry.tier}  "
              f"{where}")
    return 0


def cmd_exporter(args: argparse.Namespace) -> int:
    from coordinator.job.metrics_server import MetricsServer
    from coordinator.operations.exporter import Exporter
    from coordinator.tidemark import Tidemark
    exporter = Exporter(lambda: Tidemark.connect(args.zk, root=args.root, connect_timeout=args.timeout,
                                                 operation_timeout=args.timeout, tls=_tls(args), read_only=True),
                        refresh_every=args.refresh, max_age=args.refresh + args.timeout)
    server = MetricsServer(args.port, args.address)
    server.attach(exporter.registry, healthy=exporter.alive)
    exporter.start()
    print(f"serving Prometheus metrics on http://{args.address}:{server.port}/metrics (health: /healthz)", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait()
    finally:
        server.close()
        exporter.close()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from coordinator.iceberg.catalog import CatalogSettings
    from coordinator.serving.auth import ServerAuth
    from coordinator.serving.credentials import CredentialVending
    from coordinator.serving.hold import HoldRule
    from coordinator.serving.served_versions import ServedVersions
    from coordinator.serving.server import CatalogServer, tls_context
    from coordinator.tidemark import Tidemark
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        raise TidemarkError("--tls-cert-file and --tls-key-file go together: give both to serve HTTPS, or neither")
    auth = ServerAuth.from_env()
    tls = tls_context(args.tls_cert_file, args.tls_key_file) if args.tls_cert_file else None
    served = ServedVersions(CatalogSettings.from_env(),
                            lambda: Tidemark.connect(args.zk, root=args.root, connect_timeout=args.timeout,
                                                     operation_timeout=args.timeout, tls=_tls(args), read_only=True),
                            rule=HoldRule(args.query_gap_ms, int(args.max_hold * 1000)))
    try:
        server = CatalogServer(served, host=args.host, port=args.port, auth=auth, tls=tls,
                               storage_config=args.storage_config,
                               vend_credentials_to_anyone=args.unsafe_vend_credentials_to_anyone,
                               credentials=CredentialVending(Vending(args.vend_credentials),
                                                             role_arn=args.sts_role_arn, duration_s=args.sts_duration,
                                                             endpoint=args.sts_endpoint),
                               max_connections=args.max_connections)
    except OSError as exc:
        served.close()
        raise TidemarkError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; choose another "
                            "--port or --host") from None
    if not auth.required and not _is_loopback(args.host):
        print(f"tidemark: warning: serving on {args.host} with no authentication: whoever reaches it reads every "
              "table; set TIDEMARK_SERVE_TOKENS, or TIDEMARK_SERVE_CLIENT_ID and TIDEMARK_SERVE_CLIENT_SECRET",
              file=sys.stderr, flush=True)
    print(f"serving consistent versions of {served.settings.describe()} as an Iceberg REST catalog on {server.url} "
          f"({'bearer tokens required' if auth.required else 'no authentication'}; storage credentials to "
          f"{server.credentials_go_to()}; metrics: {server.url}/metrics)", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: server.shut_down())  # requests in flight finish, new ones are refused
    try:
        server.serve_forever()
    finally:
        server.stop()
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a malformed command line in one line (usage stays in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, error_line(f"{message} (see `{self.prog} --help`)") + "\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 and up to 3600")
    return value


def _sts_duration(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 900 <= int(text) <= 43200:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 900 to 43200 (what STS issues)")
    return int(text)


def _milliseconds(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) > 3_600_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds from 0 to 3600000")
    return int(text)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback only; a name that does not resolve is not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def _count(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count from 1 to 1000000")
    return int(text)


def _port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def _orphan_age(text: str) -> int:
    """``--older-than``: a length of at least a day, as Iceberg's remove_orphan_files procedure requires."""
    from coordinator.history.retention import DAY_MS, parse_length
    try:
        ms = parse_length(text)
    except TidemarkError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if ms < DAY_MS:
        raise argparse.ArgumentTypeError(f"{text} is less than a day: a write still in progress could "
                                         "lose its files (GarbageCollector.remove_orphan_files takes any age)")
    return ms


def _interval(text: str) -> int:
    """``--set-interval``: milliseconds, ``MIN_INTERVAL_MS`` to a day (a typo of a few digits froze pipelines)."""
    if not text.isascii() or not text.isdigit() or not MIN_INTERVAL_MS <= int(text) <= MAX_INTERVAL_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is not an interval of {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS} ms "
                                         "(a day): for hourly or daily jobs keep a short grid and give the jobs a "
                                         "cadence (every='1h')")
    return int(text)


class _Version(argparse.Action):
    """``--version``: the installed distribution's name and version, found when asked (not on every command)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print tidemark's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: Optional[str] = None) -> None:
        import platform
        from importlib import metadata
        where = Path(__file__).resolve().parent.parent
        found = next((d for d in metadata.distributions()
                      if "coordinator" in (d.read_text("top_level.txt") or "").split()), None)
        name = f"{found.metadata['Name']} {found.version}" if found is not None else "tidemark (not installed)"
        print(f"{name} (coordinator at {where}, Python {platform.python_version()})")
        parser.exit()


def _job_name(text: str) -> str:
    """A job's name, checked by the rule every command and the library share before it looks anything up."""
    from coordinator.names import validate_name
    try:
        return validate_name(text, "job name")
    except TidemarkError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _epoch(text: str) -> int:
    from coordinator.names import MAX_EPOCH_MS
    if not text.isascii() or not text.isdigit() or int(text) > MAX_EPOCH_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is not an epoch (milliseconds since 1970, 0 to {MAX_EPOCH_MS})")
    return int(text)


def _version(text: str) -> int:
    """``--as-of``: an epoch, or the tag ``tidemark-<pipeline>-<epoch>`` of a retained version."""
    from coordinator.history.versions import parse_version_ref
    try:
        return _epoch(str(parse_version_ref(text)))
    except (TidemarkError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{text!r} is neither an epoch (milliseconds since 1970) nor a tag "
                                         "tidemark-<pipeline>-<epoch>; `tidemark versions` lists the retained ones") \
            from None


def build_parser() -> argparse.ArgumentParser:
    """The ``tidemark`` command line: the options every command takes, then each family of commands, declared by
    its own function below in the order ``tidemark --help`` lists them."""
    parser = _Parser(prog="tidemark", description="Consistent, exactly-once Iceberg tables. Commands that change "
                     "shared state say what they would do and ask (without a terminal: --yes); --dry-run only says "
                     "it. Read commands take --json. `tidemark COMMAND --help` explains each option.")
    _add_connection_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for add_commands in (_add_zk, _add_lakehouse, _add_deployment_commands, _add_job_commands, _add_rest_commands,
                         _add_barriers, _add_exporter, _add_serve, _add_resolve, _add_gc, _add_versions):
        add_commands(sub)
    _describe_commands(parser)
    return parser


def _describe_commands(parser: argparse.ArgumentParser) -> None:
    """Every command's ``--help`` opens with what its family's ``--help`` says of it: one sentence, written once, in
    the ``help=`` of its ``add_parser`` (more goes in an ``epilog``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                action.choices[choice.dest].description = choice.help
                _describe_commands(action.choices[choice.dest])


JSON_HELP = "print one JSON document on stdout instead of text"
if TYPE_CHECKING:  # what each _add_* function below adds its commands to
    Commands = argparse._SubParsersAction[_Parser]


def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    """--version, and how every command reaches ZooKeeper."""
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--zk", help="ZooKeeper connect string host:port[,host:port...][/chroot] "
                                     "(default: $TIDEMARK_ZK or 127.0.0.1:2181)")
    parser.add_argument("--root", default="/tidemark", help="root znode of the deployment (default /tidemark)")
    parser.add_argument("--timeout", type=_seconds, default=15.0, metavar="S",
                        help="seconds to wait for ZooKeeper, above 0 and up to 3600 (default 15)")
    tls = parser.add_argument_group("TLS to ZooKeeper's secureClientPort (or TIDEMARK_ZK_TLS* variables)")
    tls.add_argument("--tls", action="store_true", help="use TLS with the system's CAs ($TIDEMARK_ZK_TLS=1)")
    tls.add_argument("--tls-ca", metavar="PEM", help="CA of the servers' certificates ($TIDEMARK_ZK_TLS_CA)")
    tls.add_argument("--tls-cert", metavar="PEM", help="client certificate ($TIDEMARK_ZK_TLS_CERT)")
    tls.add_argument("--tls-key", metavar="PEM", help="client certificate's key ($TIDEMARK_ZK_TLS_KEY)")


def _add_zk(sub: Commands) -> None:
    """``tidemark zk start|stop|status``."""
    zk = sub.add_parser("zk", help="a local ZooKeeper server (for trying Tidemark out, the demo and tests)")
    zk_actions = zk.add_subparsers(dest="action", required=True)
    for action, helptext in (
            ("start", "start one in the background and print its connect string (when one already runs with "
                      "--data-dir: print its connect string)"),
            ("stop", "stop the one recorded in --data-dir"),
            ("status", "say whether it serves (exits 3 when it does not)")):
        action_parser = zk_actions.add_parser(action, help=helptext)
        action_parser.add_argument("--port", type=_port,
                                   help=f"its client port, 1-65535 (start: default {DEFAULT_PORT}; stop and status: "
                                        "refuse a server recorded with another port)")
        action_parser.add_argument("--data-dir", type=Path, help="its data directory, where its pid and port are "
                                                                 "recorded (default: $TIDEMARK_HOME/zookeeper)")
        if action == "status":
            action_parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
        if action == "start":
            action_parser.add_argument("--require-auth", action=argparse.BooleanOptionalAction, default=None,
                                 help="refuse clients without a digest identity (default: when TIDEMARK_ZK_USER or "
                                      "TIDEMARK_ZK_READER_USER is set)")
        action_parser.set_defaults(func=cmd_zk, json=False, require_auth=None)


def _add_lakehouse(sub: Commands) -> None:
    """``tidemark lakehouse start|env|stop|status``."""
    lakehouse = sub.add_parser("lakehouse", help="a local S3 endpoint and Iceberg REST catalog (SeaweedFS, the "
                                                 "lakehouse extra), for trying Tidemark on the stack it runs on")
    lakehouse_actions = lakehouse.add_subparsers(dest="action", required=True)
    for action, helptext in (
            ("start", "start one in the background and print the PYICEBERG_CATALOG__* settings that reach it "
                      "(eval \"$(tidemark lakehouse start)\"); when one already runs with --data-dir, print its "
                      "settings"),
            ("env", "print the settings of the one running with --data-dir, for another terminal or a notebook "
                    "(eval \"$(tidemark lakehouse env)\"; an error when none runs)"),
            ("stop", "stop the one recorded in --data-dir"),
            ("status", "say whether it serves (exits 3 when it does not, or when its disk is too full for it to "
                       "write)")):
        action_parser = lakehouse_actions.add_parser(action, help=helptext)
        action_parser.add_argument("--data-dir", type=Path, help="its data directory, where its pid and ports are "
                                                                 "recorded (default: $TIDEMARK_HOME/lakehouse)")
        action_parser.set_defaults(func=cmd_lakehouse)


def _add_deployment_commands(sub: Commands) -> None:
    """``tidemark init``, ``status`` and ``topology``."""
    init = sub.add_parser("init", help="create the tree's top-level znodes and secure them for the identities "
                                       "configured (run once as the operator before jobs with their own identity)")
    init.set_defaults(func=cmd_init)

    status = sub.add_parser("status", help="jobs, leaders, tidemarks, lag and what each job waits for")
    status.add_argument("--json", action="store_true", help=JSON_HELP)
    status.set_defaults(func=cmd_status)

    topology = sub.add_parser("topology", help="the job graph")
    topology.add_argument("--format", choices=["text", "json", "dot", "mermaid"], default="text",
                          help="text (default), json, Graphviz dot or a Mermaid flowchart")
    topology.add_argument("--json", action="store_true", help="the same as --format json")
    topology.set_defaults(func=cmd_topology)


def _add_job_commands(sub: Commands) -> None:
    """``tidemark fence JOB`` and ``unregister JOB``."""
    fence = sub.add_parser("fence", help="bump a job's term so its current leader can no longer commit")
    fence.add_argument("job", type=_job_name, help="the job's name (`tidemark status` lists them)")
    fence.add_argument("--by", default="operator", help="who fenced it (recorded in the term znode)")
    _confirmation(fence)
    fence.set_defaults(func=cmd_fence)

    unregister = sub.add_parser("unregister", help="remove a fenced or leaderless job (says what a re-registration "
                                                   "resumes from; asks for confirmation)")
    unregister.add_argument("job", type=_job_name, help="the job's name (`tidemark status` lists them)")
    unregister.add_argument("--yes", action="store_true", help="go ahead without asking (needed without a terminal)")
    unregister.add_argument("--dry-run", action="store_true", help="say what would happen and what a "
                            "re-registration resumes from; change nothing")
    unregister.add_argument("--unfenced", action="store_true",
                            help="go ahead even though the sinks cannot be fenced in Iceberg (catalog unreachable, "
                                 "sinks dropped): only for sinks gone for good, as a still-running leader could "
                                 "commit to them again")
    unregister.set_defaults(func=cmd_unregister)

    release = sub.add_parser("release", help="say that the tables of a job no longer registered are final: readers "
                                             "with ZooKeeper read them by their Iceberg records",
                             epilog="For tables whose job was unregistered by a Tidemark release that did not "
                                    "record the release (`unregister` does now): until then a reader with "
                                    "ZooKeeper does not read them, as after a ZooKeeper loss.")
    release.add_argument("tables", nargs="+", metavar="TABLE", help="a table (namespace.table)")
    _confirmation(release)
    release.set_defaults(func=cmd_release)


def _add_rest_commands(sub: Commands) -> None:
    """``tidemark pause JOB``, ``retire JOB`` and ``resume JOB``."""
    for command, helptext in (
            ("pause", "say a job is stopped on purpose (maintenance): while no leader runs it, it is not stale and its "
                      "tables leave the consistent lag; until `tidemark resume` or --for"),
            ("retire", "take a job out of service, keeping its registration and its tables readable at their last "
                       "epoch: not stale, out of the consistent lag; its drivers refuse to lead it until resumed"),
            ("resume", "remove a pause or a retirement (a job with no live leader is then stale again)")):
        rest = sub.add_parser(command, help=helptext)
        rest.add_argument("job", type=_job_name, help="the job's name (`tidemark status` lists them)")
        _confirmation(rest)
        if command != "resume":
            rest.add_argument("--reason", default="", help="why (shown by `tidemark status`)")
            rest.add_argument("--by", default="operator", help="who did it (recorded with the mark)")
        if command == "pause":
            rest.add_argument("--for", dest="duration", metavar="DURATION",
                              help="end the pause by itself after this long (30m, 2h, 1d): then, with no live leader, "
                                   "the job is stale again; default: until resumed")
        rest.set_defaults(func=cmd_rest)


def _add_barriers(sub: Commands) -> None:
    """``tidemark barriers [--set-interval MS --from T | --revert [--from T]]``."""
    barriers = sub.add_parser("barriers", help="show the barrier grid and each job's cadence, change the grid's "
                                               "interval at a future grid point, or cancel a pending change")
    barriers.add_argument("--json", action="store_true", help=JSON_HELP)
    barriers.add_argument("--set-interval", type=_interval, metavar="MS",
                          help=f"the grid's new interval, {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS} ms (a day), for "
                               "every job; needs --from")
    barriers.add_argument("--from", dest="effective_from", type=_epoch, metavar="T",
                          help=f"with --set-interval: when it takes effect (ms since 1970), {CHANGE_LEAD_MS // 1000} s "
                               "to 30 days ahead, at a point of the current grid or, to leave a grid whose next "
                               "point is far away, at a multiple of MS before it (the error names the earliest); "
                               "with --revert: which pending change to cancel")
    barriers.add_argument("--revert", action="store_true",
                          help="cancel the interval changes that have not taken effect yet (at least "
                               f"{CHANGE_LEAD_MS // 1000} s ahead); a change in force is undone by a new change")
    _confirmation(barriers)
    barriers.set_defaults(func=cmd_barriers)


def _add_exporter(sub: Commands) -> None:
    """``tidemark exporter``."""
    exporter = sub.add_parser("exporter", help="serve the topology-wide view as Prometheus metrics (read-only)")
    exporter.add_argument("--port", type=_port, default=EXPORTER_PORT,
                          help=f"port of /metrics and /healthz (default {EXPORTER_PORT})")
    exporter.add_argument("--address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    exporter.add_argument("--refresh", type=_seconds, default=5.0, metavar="S",
                          help="seconds between reads of ZooKeeper (scrapes never wait on it)")
    exporter.set_defaults(func=cmd_exporter)


def _add_serve(sub: Commands) -> None:
    """``tidemark serve``."""
    serve = sub.add_parser("serve", help="an Iceberg REST catalog (read-only) that serves every table at a consistent "
                                         "version: point Trino, Spark, DuckDB or pyiceberg at it")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for "
                                                           "every interface)")
    serve.add_argument("--port", type=_port, default=8181, help="port (default 8181)")
    serve.add_argument("--query-gap-ms", type=_milliseconds, default=DEFAULT_QUERY_GAP_MS, metavar="MS",
                       help="a client's loads less than this apart are one query, at one version (a table the "
                            "query has not loaded yet: up to 4 times this apart); a load after a longer gap starts the "
                            f"next query at the newest version (default {DEFAULT_QUERY_GAP_MS}; 0: every load gets the "
                            "newest)")
    serve.add_argument("--max-hold", type=_seconds, default=DEFAULT_MAX_HOLD_MS / 1000, metavar="S",
                       help="a client busy with no such gap still moves to the newest version after this long "
                            f"(default {DEFAULT_MAX_HOLD_MS // 1000})")
    serve.add_argument("--storage-config", action=argparse.BooleanOptionalAction, default=True,
                       help="hand engines the backing catalog's object-store settings (s3.*) with each table, and its "
                            "credentials to authenticated clients that ask for them (default: yes; "
                            "--no-storage-config: engines use their own)")
    serve.add_argument("--vend-credentials", choices=[v.value for v in Vending], default=Vending.STS.value,
                       help="the credentials vended with a table: sts (default), short-lived ones from the object "
                            "store's STS that only read the table's files; static, the backing catalog's own keys")
    serve.add_argument("--sts-role-arn", metavar="ARN", help="the role STS credentials are issued for (AWS and Ceph "
                       "need one; SeaweedFS and MinIO issue them for the catalog's own identity without)")
    serve.add_argument("--sts-endpoint", metavar="URL", help="the STS endpoint (default: the object store's "
                       "s3.endpoint, else AWS's)")
    serve.add_argument("--sts-duration", type=_sts_duration, default=DEFAULT_STS_DURATION_S, metavar="S",
                       help=f"how long STS credentials last, 900 to 43200 s (default {DEFAULT_STS_DURATION_S})")
    serve.add_argument("--unsafe-vend-credentials-to-anyone", action="store_true",
                       help="hand the object store's credentials to every client, authenticated or not (with no "
                            "authentication configured, the only way engines get them from the server)")
    serve.add_argument("--max-connections", type=_count, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                       help=f"open connections at most; a request beyond is answered 503 (default "
                            f"{DEFAULT_MAX_CONNECTIONS})")
    serve.add_argument("--tls-cert-file", metavar="PEM", help="serve HTTPS with this certificate (and --tls-key-file)")
    serve.add_argument("--tls-key-file", metavar="PEM", help="the certificate's private key")
    serve.set_defaults(func=cmd_serve)


def _add_resolve(sub: Commands) -> None:
    """``tidemark resolve TABLE...``."""
    resolve = sub.add_parser("resolve", help="the snapshot of each table at one consistency level")
    resolve.add_argument("tables", nargs="+", metavar="TABLE", help="tables to read together, namespace.table "
                                                                      "(or catalog.namespace.table)")
    resolve.add_argument("--level", choices=["latest", "committed", "consistent"], default="consistent",
                         help="consistent (default): the newest epoch every table holds; committed: each table at its "
                              "own committed epoch; latest: each table's current snapshot")
    resolve.add_argument("--as-of", type=_version, metavar="T", help="a retained version, by its epoch or its tag "
                         "tidemark-<pipeline>-<T> (`tidemark versions` lists them), or any epoch every table holds")
    resolve.add_argument("--scope", default="pipeline", metavar="SCOPE",
                         help="what a consistent version is consistent across: pipeline (the default: every table of "
                              "the tables' pipelines, as tidemark serve serves them), namespace:<ns>, all, or set "
                              "(exactly these tables; with --no-zk always)")
    resolve.add_argument("--no-zk", action="store_true", help="resolve from Iceberg metadata alone")
    resolve.add_argument("--format", choices=["text", "sql"], default="text",
                         help="sql: a Spark SQL / Trino statement per table reading it at the version, by its tag "
                         "(tidemark-<pipeline>-<T>, on a retained version) or its snapshot id")
    resolve.add_argument("--json", action="store_true", help=JSON_HELP)
    resolve.set_defaults(func=cmd_resolve)


def _add_gc(sub: Commands) -> None:
    """``tidemark gc``."""
    gc = sub.add_parser("gc", help="keep the versions the retention policy wants, expire the rest and delete its files")
    gc.add_argument("--dry-run", action="store_true", help="print what would be kept and dropped, and why")
    gc.add_argument("--yes", action="store_true", help="go ahead without asking (needed without a terminal, as in a "
                                                       "CronJob)")
    gc.add_argument("--json", action="store_true", help=JSON_HELP)
    gc.add_argument("--policy", metavar="SPEC", help="record this retention policy for the deployment first, e.g. "
                    "all:1h,hourly:48h,daily:30d,weekly:52w,monthly:24mo,tags:hourly (tags:E: only the versions of "
                    "tiers of E or coarser, and the newest, get an Iceberg tag; default hourly) (with --dry-run: "
                    "preview it only)")
    gc.add_argument("--orphans", action="store_true", help="then delete the files under each managed table's "
                    "location that no metadata references (left by killed writers or a killed gc); lists them "
                    "all, so daily is enough")
    gc.add_argument("--wait", type=_seconds, default=300.0, metavar="S",
                    help="wait this long for a garbage collection another process is running, above 0 and up to "
                         "3600 s (default 300)")
    gc.add_argument("--skip-if-running", action="store_true", help="when another run still holds the GC lock "
                    "after --wait, say so and exit 0 (for schedules: that run does the same work)")
    gc.add_argument("--older-than", type=_orphan_age, default="3d", metavar="LENGTH",
                    help="with --orphans: only files not modified for this long, at least 1d (default 3d)")
    gc.set_defaults(func=cmd_gc)


def _add_versions(sub: Commands) -> None:
    """``tidemark versions``."""
    versions = sub.add_parser("versions", help="the retained consistent versions, with their tier and age")
    versions.add_argument("--json", action="store_true", help=JSON_HELP)
    versions.set_defaults(func=cmd_versions)


def _confirmation(command: argparse.ArgumentParser) -> None:
    """--yes and --dry-run, for a command that changes shared state."""
    command.add_argument("--yes", action="store_true", help="go ahead without asking (needed without a terminal)")
    command.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")



def main(argv: Optional[list[str]] = None) -> int:
    """Run one command; every failure is one ``tidemark: error:`` line on stderr, never a traceback."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a usage error already reported in one line
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    # kazoo's own loggers (recipes, handlers) would reach Python's last-resort handler; our sessions' connection
    # changes are one line each (coordinator.zookeeper.session), shown with the rest of Tidemark's log below.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    with logging_to_stderr(fmt="tidemark: %(message)s"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at the interpreter's exit, so that a closed pipe is caught below
        return code
    except TidemarkError as exc:
        return _fail(str(exc))
    except BrokenPipeError:
        # The reader of our output went away (`| head`): stop quietly. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the last resort: a bug still gets one line, not a traceback
        return _fail(f"unexpected {type(exc).__name__}: {exc}. This is a bug in tidemark: please report it "
                     "with the command that caused it")


def _fail(message: str) -> int:
    print(error_line(message), file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
