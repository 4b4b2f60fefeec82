"""An IterationLog over a real SQLite file and a real file:// blob store in tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.compactor.domain.model import TierConfig
from services.compactor.repository import CompactorRepository
from services.compactor.server import MIGRATIONS
from services.compactor.service import IterationLog
from services.compactor.tiers.steps import StepHook, no_step_hook
from tests.unit.compactor.support import LogFactory


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'compactor.db'}")
    db.upgrade(MIGRATIONS)
    yield db
    db.dispose()


@pytest.fixture
def blobs(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "blobs")


@pytest.fixture
def make_log(database: Database, blobs: FileBlobStore) -> LogFactory:
    def build(hook: StepHook = no_step_hook, **config: int) -> IterationLog:
        return IterationLog(CompactorRepository(database), blobs, TierConfig(**config), hook)

    return build
