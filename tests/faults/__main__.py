"""``make test-faults``: run the fault suite and print its summary table.

    python -m tests.faults                                  # every scenario, its default runs and faults
    python -m tests.faults --scenario kill-9 --runs 1 --faults 10 --seed 7

Exit status 0 when every scenario passed (no duplicate, loss, inconsistent read or unrecovered
fault, and every run finished), 1 otherwise. Per-run details (unexpected driver exits, problems)
are printed as the runs end; driver logs stay in ``--base`` (default: a temporary directory).
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from tests.faults.harness import Environment, RunResult
from tests.faults.scenarios import SCENARIOS, run_scenario
from tests.faults.summary import Row, slow_faults, table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                        help="run only this scenario (repeatable); default: all")
    parser.add_argument("--runs", type=int, help="runs per scenario (default: each scenario's own)")
    parser.add_argument("--faults", type=int, help="faults per run (default: each scenario's own)")
    parser.add_argument("--seed", type=int, default=20261122, help="base seed; run i of a scenario uses seed + i")
    parser.add_argument("--base", type=Path, help="where runs keep their logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    base = args.base or Path(tempfile.mkdtemp(prefix="tidemark-faults-"))
    names = args.scenario or list(SCENARIOS)
    rows = []
    started = time.monotonic()
    print(f"fault suite: scenarios {', '.join(names)}; logs in {base}", flush=True)
    with Environment(base) as env:
        for name in names:
            scenario = SCENARIOS[name]
            results: list[RunResult] = []
            for run in range(args.runs or scenario.runs):
                seed = args.seed + run
                t0 = time.monotonic()
                result = run_scenario(env, name, run, seed, args.faults or scenario.faults)
                results.append(result)
                report_run(result, run, time.monotonic() - t0, base / f"{name}-{run}")
            rows.append(Row.of(name, results))
    print(f"\nfault suite finished in {(time.monotonic() - started) / 60:.1f} min\n")
    print(table(rows))
    return 0 if all(row.passed for row in rows) else 1


def report_run(result: RunResult, run: int, seconds: float, logs: Path) -> None:
    recoveries = sorted(f.recovery_s for f in result.faults if f.recovery_s is not None)
    print(f"{result.scenario} run {run} (seed {result.seed}, {seconds:.0f} s): {len(result.faults)} faults, "
          f"{result.epochs_committed} epochs, {result.produced} rows produced, {result.checked} versions checked, "
          f"{result.duplicates} duplicates, {result.losses} losses, {len(result.inconsistencies)} inconsistent, "
          f"recovery max {recoveries[-1] if recoveries else '-'} s -> {'PASS' if result.passed else 'FAIL'}",
          flush=True)
    for inconsistency in result.inconsistencies:
        print(f"    inconsistent read at epoch {inconsistency.epoch}: {inconsistency.problem}")
    for problem in result.problems:
        print(f"    problem: {problem}")
    for exit_ in result.unexpected_exits:
        print(f"    driver exit: {exit_}")
    if result.unreadable:
        errors = sorted({error.split(":")[0] for error in result.unreadable})
        print(f"    checker: {len(result.unreadable)} reads failed during outages ({', '.join(errors)})")
    kinds: dict[str, int] = {}
    for fault in result.faults:
        kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
    print("    faults: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())), flush=True)
    for line in slow_faults(result, logs):
        print(f"    slow: {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
