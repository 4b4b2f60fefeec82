"""A start checks the chain only from the last fully verified checkpoint; the full check (every
link and the replay against the state tables) runs in the background and, on failure, refuses
changes exactly as a failed start check does. SQLite and Postgres."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy
import sqlalchemy.orm

from services.common.db import Database
from services.common.errors import IntegrityError
from services.governance.domain.tiers import TrustTier
from services.governance.service import GovernanceService


class _Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        self.ms += 1
        return self.ms


def _history(service: GovernanceService, changes: int) -> None:
    for i in range(changes):
        service.set_tier("fleet-a", f"agent-{i % 3}",
                         TrustTier.PROBATION if i % 2 else TrustTier.TRUSTED, "admin", f"r{i}")


def _started(database: Database) -> tuple[GovernanceService, list[list[str]]]:
    """A new process's start: the quick check, then the full one in the background (done)."""
    service = GovernanceService(database, _Clock())
    _, problems = service.verify_at_start()
    heard: list[list[str]] = []
    if not problems:
        service.start_full_verification(on_broken=heard.append)
        service.wait_full_verification()
    return service, heard


def _sql(database: Database, statement: str) -> None:
    with database.session() as session:
        session.execute(sqlalchemy.text(statement))


def test_a_full_verification_moves_the_checkpoint_a_start_checks_from(
        database: Database) -> None:
    first, heard = _started(database)
    _history(first, 6)
    assert first.checkpoint().length == 6
    second, heard = _started(database)  # its full check saw all 6 entries intact
    assert second.chain_intact and not heard
    _history(second, 2)
    third = GovernanceService(database, _Clock())
    reached, problems = third.verify_at_start()
    assert (reached.length, problems) == (8, [])


def test_an_entry_edited_after_the_checkpoint_is_found_by_the_start_check(
        database: Database) -> None:
    first, _ = _started(database)
    _history(first, 3)
    _started(database)  # checkpoint at 3
    _history(first, 3)
    _sql(database, "UPDATE witness_chain SET payload_json = replace(payload_json, 'r1', 'rX') "
                   "WHERE seq = 4")
    service = GovernanceService(database, _Clock())
    _, problems = service.verify_at_start()
    assert any("entry 4" in p for p in problems)
    assert not service.chain_intact
    with pytest.raises(IntegrityError):
        service.require_writable()


def test_an_edit_before_the_checkpoint_is_found_in_the_background_and_refuses_changes(
        database: Database) -> None:
    first, _ = _started(database)
    _history(first, 6)
    _started(database)  # checkpoint at 6
    _sql(database, "UPDATE witness_chain SET payload_json = replace(payload_json, 'r1', 'rX') "
                   "WHERE seq = 1")
    _sql(database, "UPDATE agents SET score = 1000 WHERE agent_id = 'agent-2'")
    service = GovernanceService(database, _Clock())
    _, problems = service.verify_at_start()
    assert problems == []  # the quick check reads only entries 6.. and the link at 5
    assert service.chain_intact
    heard: list[list[str]] = []
    service.start_full_verification(on_broken=heard.append)
    service.wait_full_verification()
    assert not service.chain_intact
    assert heard and any("entry 1" in p for p in heard[0])
    assert any("agent-2" in p for p in heard[0])
    with pytest.raises(IntegrityError):
        service.require_writable()
    _, problems = GovernanceService(database, _Clock()).verify_at_start()
    assert problems == []  # a failed check never moved the checkpoint past the edit
    with database.session() as session:
        (length,) = session.execute(sqlalchemy.text(
            "SELECT length FROM witness_verified")).one()
    assert length == 6


def test_a_rewritten_history_below_the_checkpoint_is_found_at_start(database: Database) -> None:
    first, _ = _started(database)
    _history(first, 6)
    _started(database)  # checkpoint at 6
    _sql(database, "UPDATE witness_chain SET link = '" + "ab" * 32 + "' WHERE seq = 5")
    service = GovernanceService(database, _Clock())
    _, problems = service.verify_at_start()
    assert any("history was rewritten" in p for p in problems)


def test_changes_committed_during_a_verification_are_not_taken_for_tampering(
        database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verification walks the chain, then reads the head and the state tables: a change
    committed between those reads (a gate decision under load) must not make it report a
    broken chain (it did, and governance then refused every write until restarted)."""
    service, _ = _started(database)
    _history(service, 4)
    real_head = service._repo.head

    def head_after_a_change(session: sqlalchemy.orm.Session) -> object:
        writer = threading.Thread(target=_history, args=(service, 2))
        writer.start()  # another request's change, committed while the verification reads
        writer.join(timeout=30)
        assert not writer.is_alive()
        return real_head(session)

    monkeypatch.setattr(service._repo, "head", head_after_a_change)
    reached, problems = service.verify()
    assert problems == []
    assert reached.length == 4  # what it saw: the moment it began reading
    monkeypatch.undo()
    reached, problems = service.verify()
    assert (reached.length, problems) == (6, [])
    heard: list[list[str]] = []
    service.start_full_verification(on_broken=heard.append)
    service.wait_full_verification()
    assert service.chain_intact and not heard
