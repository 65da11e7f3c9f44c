"""A driver process for fault tests: leads one job and runs epoch steps read from stdin.

    python -m tests.helpers.leader CONNECT JOB SINK[,SINK...] SESSION_TIMEOUT

Prints ``LEADING <term>`` once elected, then one line per command: ``OK <state>`` or
``ERR <ExceptionName> <message>``. Commands: ``begin T``, ``precommit T``, ``commit T``, ``exit``.
The epochs it begins must be barriers of the job's grid, after its last committed one.
"""
from __future__ import annotations

import sys

from coordinator import EpochCoordinator, EpochInputs, SourceRange, Tidemark, TidemarkError

SOURCE = "raw.in"


def inputs(epoch: int) -> EpochInputs:
    """What the fault tests record as an epoch's inputs: the root source's range up to ``epoch``."""
    return EpochInputs({SOURCE: SourceRange(None, epoch)})


def main() -> None:
    connect, job, sinks, session_timeout = sys.argv[1], sys.argv[2], sys.argv[3].split(","), float(sys.argv[4])
    tm = Tidemark.connect(connect, session_timeout=session_timeout, operation_timeout=10)
    leadership = tm.leadership(job)
    print("LEADING", leadership.acquire(), flush=True)
    epochs = EpochCoordinator(leadership, sinks)
    print("RECOVERY", epochs.recover().action.value, flush=True)
    for line in sys.stdin:
        command, *arg = line.split()
        if command == "exit":
            break
        epoch = int(arg[0])
        try:
            if command == "begin":
                record = epochs.begin(epoch, inputs(epoch))
            elif command == "precommit":
                record = epochs.precommit(epoch, {s: epoch + i for i, s in enumerate(sorted(sinks))})
            else:
                record = epochs.commit(epoch, {s: epoch + i for i, s in enumerate(sorted(sinks))})
            print("OK", record.state.value, flush=True)
        except TidemarkError as exc:
            print("ERR", type(exc).__name__, exc, flush=True)
    leadership.release()
    tm.close()


if __name__ == "__main__":
    main()
