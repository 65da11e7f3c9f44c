"""Running an ``EpochWriter`` loop on a thread in tests."""
from __future__ import annotations

import threading
from typing import Optional

from coordinator import EpochWriter


class InBackground:
    """``writer.run(step)`` on a thread, until ``stop()``; an error of the loop is raised by ``stop()``."""

    def __init__(self, w: EpochWriter, step) -> None:
        self.writer = w
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(step,), daemon=True)
        self.thread.start()

    def _run(self, step) -> None:
        try:
            self.writer.run(step, stop_on_sigterm=False)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.writer.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"writer {self.writer.name} did not stop"
        if self.error is not None:
            raise self.error
