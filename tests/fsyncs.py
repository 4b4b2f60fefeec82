"""Which files and directories a test's code fsyncs: ``os.fsync`` recorded by the path its
descriptor names (Linux's /proc/self/fd), then done for real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every path fsynced from now on (until ``monkeypatch`` is undone), in order."""
    synced: list[Path] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced
