"""Background work on an interval: memory compaction for configured fleets (off when the
interval is 0) and the repair of interrupted tier work (always on)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from services.common.errors import EngramError
from services.compactor.service import IterationLog, MemoryPolicyRunner

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


class TierRepairLoop:
    """Finishes interrupted tier work from start-up on: a pass at once, then one every
    ``interval_s``; runs that fail wait out their backoff (:class:`RepairBackoff`)."""

    def __init__(self, iteration_log: IterationLog, interval_s: float) -> None:
        self._log = iteration_log
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tier-repair", daemon=True)
        self._thread.start()

    def run_once(self) -> int:
        try:
            repaired = self._log.recover()
        except Exception:
            # e.g. the database is unreachable: the next pass tries again
            log.exception("tier repair pass failed", extra={"retry_in_s": self._interval})
            return 0
        if repaired:
            log.info("finished interrupted tier work", extra={"runs": repaired})
        return repaired

    def _loop(self) -> None:
        self.run_once()
        while not self._stop.wait(self._interval):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
