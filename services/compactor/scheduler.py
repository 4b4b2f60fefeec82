"""Runs memory compaction for configured fleets on an interval (off when the interval is 0)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from services.common.errors import EngramError
from services.compactor.service import MemoryPolicyRunner

log = logging.getLogger("engram.compactor.schedule")


class CompactionSchedule:
    def __init__(self, runner: MemoryPolicyRunner, fleets: Sequence[str], interval_s: float,
                 importance_below: float, older_than_days: float) -> None:
        self._runner = runner
        self._fleets = list(fleets)
        self._interval = interval_s
        self._below = importance_below
        self._days = older_than_days
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._interval > 0 and bool(self._fleets)

    def start(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._loop, name="compaction-schedule",
                                        daemon=True)
        self._thread.start()

    def run_once(self) -> None:
        for fleet in self._fleets:
            try:
                run = self._runner.compact(fleet, "scheduled", dry_run=False,
                                           importance_below=self._below,
                                           older_than_days=self._days)
                log.info("scheduled compaction", extra={"fleet": fleet, "policy_run": run.id,
                                                        "compacted": run.compacted})
            except EngramError as error:
                log.warning("scheduled compaction failed (recorded as a failed policy run)",
                            extra={"fleet": fleet, "error": error.message})

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
