"""The fault suite's summary table: one row per scenario, and a total."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from tests.faults.harness import SESSION_TIMEOUT, RunResult

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
                   tuple(f.recovery_s for f in faults if f.recovery_s is not None),
                   sum(f.recovery_s is None for f in faults), sum(len(r.problems) for r in results))


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f} s"


def table(rows: list[Row]) -> str:
    """A Markdown table of ``rows`` plus their total."""
    total = Row("**total**", sum(r.runs for r in rows), sum(r.faults for r in rows), sum(r.epochs for r in rows),
                sum(r.duplicates for r in rows), sum(r.losses for r in rows), sum(r.inconsistent for r in rows),
                sum(r.checked for r in rows), tuple(x for r in rows for x in r.recoveries),
                sum(r.unrecovered for r in rows), sum(r.problems for r in rows))
    lines = ["| scenario | runs | faults | epochs committed | duplicates | losses | inconsistent reads "
             "(of checked) | recovery p50 | recovery max | p50 ≤ timeout + 2 s | result |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|:---:|"]
    for row in [*rows, total]:
        goal = "-" if row.p50 is None else ("yes" if row.p50 <= RECOVERY_GOAL_S else "NO")
        result = "PASS" if row.passed else "FAIL"
        if row.unrecovered or row.problems:
            result += f" ({row.unrecovered} unrecovered, {row.problems} problems)"
        lines.append(f"| {row.scenario} | {row.runs} | {row.faults} | {row.epochs} | {row.duplicates} | "
                     f"{row.losses} | {row.inconsistent} ({row.checked}) | {_seconds(row.p50)} | "
                     f"{_seconds(row.max)} | {goal} | {result} |")
    lines.append(f"\nSession timeout {SESSION_TIMEOUT:.0f} s; recovery = from the fault's injection to the next "
                 "commit of every affected job.")
    return "\n".join(lines)
