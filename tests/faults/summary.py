"""The fault suite's summary table: one row per scenario, and a total."""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional

from tests.faults.cascade import JOBS
from tests.faults.harness import SESSION_TIMEOUT, Fault, RunResult

RECOVERY_GOAL_S = SESSION_TIMEOUT + 2.0   # recovery p50 must be at most the session timeout + 2 s


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Row:
    scenario: str
    runs: int
    faults: int
    epochs: int
    duplicates: int
    losses: int
    inconsistent: int
    checked: int
    served_reads: int   # reads through `tidemark serve` (pyiceberg's RestCatalog), each checked too
    recoveries: tuple[float, ...]
    unrecovered: int
    problems: int

    @property
    def p50(self) -> Optional[float]:
        return percentile(list(self.recoveries), 0.5)

    @property
    def max(self) -> Optional[float]:
        return max(self.recoveries) if self.recoveries else None

    @property
    def passed(self) -> bool:
        return (self.duplicates == 0 and self.losses == 0 and self.inconsistent == 0 and self.unrecovered == 0
                and self.problems == 0 and self.runs > 0)

    @classmethod
    def of(cls, scenario: str, results: Iterable[RunResult]) -> Row:
        results = list(results)
        faults = [f for r in results for f in r.faults]
        return cls(scenario, len(results), len(faults), sum(r.epochs_committed for r in results),
                   sum(r.duplicates for r in results), sum(r.losses for r in results),
                   sum(len(r.inconsistencies) for r in results), sum(r.checked for r in results),
                   sum(r.served_reads for r in results),
                   tuple(f.recovery_s for f in faults if f.recovery_s is not None),
                   sum(f.recovery_s is None for f in faults), sum(len(r.problems) for r in results))


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f} s"


def table(rows: list[Row]) -> str:
    """A Markdown table of ``rows`` plus their total."""
    total = Row("**total**", sum(r.runs for r in rows), sum(r.faults for r in rows), sum(r.epochs for r in rows),
                sum(r.duplicates for r in rows), sum(r.losses for r in rows), sum(r.inconsistent for r in rows),
                sum(r.checked for r in rows), sum(r.served_reads for r in rows),
                tuple(x for r in rows for x in r.recoveries),
                sum(r.unrecovered for r in rows), sum(r.problems for r in rows))
    lines = ["| scenario | runs | faults | epochs committed | duplicates | losses | inconsistent reads "
             "(of checked) | reads through tidemark serve | recovery p50 | recovery max | p50 ≤ timeout + 2 s | "
             "result |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|:---:|"]
    for row in [*rows, total]:
        goal = "-" if row.p50 is None else ("yes" if row.p50 <= RECOVERY_GOAL_S else "NO")
        result = "PASS" if row.passed else "FAIL"
        if row.unrecovered or row.problems:
            result += f" ({row.unrecovered} unrecovered, {row.problems} problems)"
        lines.append(f"| {row.scenario} | {row.runs} | {row.faults} | {row.epochs} | {row.duplicates} | "
                     f"{row.losses} | {row.inconsistent} ({row.checked}) | {row.served_reads} | {_seconds(row.p50)} | "
                     f"{_seconds(row.max)} | {goal} | {result} |")
    lines.append(f"\nSession timeout {SESSION_TIMEOUT:.0f} s; recovery = from the fault's injection to the next "
                 "commit of every affected job. Inconsistent reads count the checker's and those through `tidemark "
                 "serve` (a broken rule, two epochs in one read, a step back).")
    return "\n".join(lines)


_LOG_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+ \S+ job (\S+?):? (.*)")


def _job_events(logs: Path) -> list[tuple[int, str, str]]:
    """(ms, job, message) of every driver's log line about a job, in time order."""
    events = []
    for path in logs.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            found = _LOG_LINE.match(line)
            if found:
                ms = int(datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000)
                events.append((ms, found.group(2), found.group(3)))
    return sorted(events)


def slow_faults(result: RunResult, logs: Path, limit: int = 5) -> list[str]:
    """Why the slowest faults of a run took longer than ``RECOVERY_GOAL_S`` to recover, fault by fault: when
    the job's next leader took over, how many further faults hit the job or its upstream before it committed
    again, and what it logged it waited for (from the drivers' logs in ``logs``)."""
    slow = sorted((f for f in result.faults if f.recovery_s is not None and f.recovery_s > RECOVERY_GOAL_S),
                  key=lambda f: -(f.recovery_s or 0))[:limit]
    events = _job_events(logs) if slow else []
    return [_explain(fault, result.faults, events) for fault in slow]


def _explain(fault: Fault, faults: list[Fault], events: list[tuple[int, str, str]]) -> str:
    end = fault.recovered_ms or fault.injected_ms
    jobs = [fault.job] if fault.job else list(JOBS)
    upstream = set(JOBS[:max(JOBS.index(j) for j in jobs) + 1])
    during = [e for e in events if fault.injected_ms < e[0] <= end and e[1] in jobs]
    takeover = next((ms for ms, _, message in during if message.startswith("leading as term")), None)
    chained = [f for f in faults if f is not fault and fault.injected_ms < f.injected_ms < end
               and (f.job is None or f.job in upstream)]
    waits = sorted({re.sub(r" \d+ s", "", m.split(": ", 1)[-1])[:90] for _, _, m in during if m.startswith("waiting")})
    return (f"{fault.kind} ({fault.job or 'every job'}): {fault.recovery_s:.1f} s; "
            + (f"a leader took over after {(takeover - fault.injected_ms) / 1000:.1f} s; " if takeover else "")
            + f"{len(chained)} more fault(s) on it or upstream before it committed"
            + (f" ({', '.join(sorted({f'{f.kind} ({f.job})' for f in chained}))})" if chained else "")
            + (f"; it waited: {' | '.join(waits)}" if waits else ""))
