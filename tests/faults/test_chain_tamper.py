"""Governance's witness chain edited behind the service's back (item 5 of issue 16).

The governance DB is changed directly while governance is stopped: an entry's payload, kind or
link edited, an entry deleted, two entries reordered, the tail truncated (with and without the
head row rewritten to match). Criterion: every tampering is found both at start (health stays
NOT_SERVING, the log says WITNESS CHAIN BROKEN) and by VerifyChain (ok false, a problem named),
and `engram gov chain verify` exits 1; the untouched chain verifies with no problem. And a
client holding a checkpoint rejects a later head that does not extend it: a store rolled back
to an earlier copy, then written on (a fork that verifies by itself).
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engram.client import GovernanceClient, ShardClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.faults.conftest import Stack, health, scale

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ADMIN = ("admin", "governor")


def _populate(stack: Stack, rng: random.Random, writes: int) -> None:
    """Gate decisions (through a gated shard), tier changes and rule changes on the chain."""
    stack.start("governance")
    stack.start("shard")
    with GovernanceClient(stack.address("governance"), stack.token("admin", roles=ADMIN)) as gov:
        for i in range(writes):
            agent = f"agent-{i % 4}"
            with ShardClient(stack.address("shard"), stack.token(agent)) as shard:
                shard.add(f"fact {i}: the build uses cache {rng.random()}", run_id="r1",
                          request_id=f"w-{i}")
            if i % 7 == 3:
                gov.set_tier(agent, rng.choice(["trusted", "probation", "standard"]),
                             reason=f"review {i}")
            if i % 11 == 5:
                reply = gov.add_rule(gpb.Rule(description=f"rule {i}",
                                              deny_pattern=gpb.DenyPattern(pattern=f"secret{i}")))
                if i % 2:
                    gov.remove_rule(reply.rule.rule_id)
    stack.stop("shard")
    stack.stop("governance")


def _files(db: Path) -> list[Path]:
    return [p for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()]


def _save(db: Path, to: Path) -> None:
    to.mkdir(parents=True, exist_ok=True)
    for path in _files(db):
        shutil.copy2(path, to / path.name)


def _restore(saved: Path, db: Path) -> None:
    for path in _files(db):
        path.unlink()
    for path in saved.iterdir():
        shutil.copy2(path, db.parent / path.name)


def _flip_text(value: str, rng: random.Random) -> str:
    at = rng.randrange(len(value))
    new = rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz0123456789{}\":, " if c != value[at]])
    return value[:at] + new + value[at + 1:]


Tamper = Callable[[sqlite3.Connection, int, random.Random], str]


def edit_payload(db: sqlite3.Connection, n: int, rng: random.Random) -> str:
    seq = rng.randrange(n)
    (payload,) = db.execute("SELECT payload_json FROM witness_chain WHERE seq=?", (seq,)).fetchone()
    db.execute("UPDATE witness_chain SET payload_json=? WHERE seq=?",
               (_flip_text(payload, rng), seq))
    return f"payload of entry {seq} edited"


def edit_kind(db: sqlite3.Connection, n: int, rng: random.Random) -> str:
    seq = rng.randrange(n)
    db.execute("UPDATE witness_chain SET kind=kind || 'x' WHERE seq=?", (seq,))
    return f"kind of entry {seq} edited"


def edit_link(db: sqlite3.Connection, n: int, rng: random.Random) -> str:
    seq = rng.randrange(n)
    (value,) = db.execute("SELECT link FROM witness_chain WHERE seq=?", (seq,)).fetchone()
    db.execute("UPDATE witness_chain SET link=? WHERE seq=?",
               (_flip_text(value, rng).replace(" ", "0"), seq))
    return f"link of entry {seq} edited"


def delete_entry(db: sqlite3.Connection, n: int, rng: random.Random) -> str:
    seq = rng.randrange(n)
    db.execute("DELETE FROM witness_chain WHERE seq=?", (seq,))
    return f"entry {seq} deleted"


def reorder(db: sqlite3.Connection, n: int, rng: random.Random) -> str:
    a, b = sorted(rng.sample(range(n), 2))
    db.execute("UPDATE witness_chain SET seq=-1 WHERE seq=?", (a,))
    db.execute("UPDATE witness_chain SET seq=? WHERE seq=?", (a, b))
    db.execute("UPDATE witness_chain SET seq=? WHERE seq=-1", (b,))
    return f"entries {a} and {b} swapped"


def truncate(db: sqlite3.Connection, n: int, rng: random.Random) -> str:
    keep = rng.randrange(1, n)
    db.execute("DELETE FROM witness_chain WHERE seq>=?", (keep,))
    return f"truncated to {keep} of {n} entries"


def truncate_with_head(db: sqlite3.Connection, n: int, rng: random.Random) -> str:
    keep = rng.randrange(1, n)
    db.execute("DELETE FROM witness_chain WHERE seq>=?", (keep,))
    (last,) = db.execute("SELECT link FROM witness_chain WHERE seq=?", (keep - 1,)).fetchone()
    db.execute("UPDATE witness_head SET length=?, head=? WHERE id=1", (keep, last))
    return f"truncated to {keep} of {n} entries, head row rewritten to match"


TAMPERS: list[Tamper] = [edit_payload, edit_kind, edit_link, delete_entry, reorder, truncate,
                         truncate_with_head]


def _wait_answer(address: str, process: subprocess.Popen[bytes], timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "governance exited at start"
        status = health(address)
        if status is not None:
            return status
        time.sleep(0.1)
    raise AssertionError("governance did not answer health in time")


def _after_full_check(stack: Stack, process: subprocess.Popen[bytes], timeout: float = 120) -> int:
    """Health once the start's background full verification has reported (passed or not):
    the start itself checks only from the last verified checkpoint."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "governance exited"
        log = stack.log("governance")
        if "WITNESS CHAIN BROKEN" in log or "full witness chain verification passed" in log:
            status = health(stack.address("governance"))
            assert status is not None
            return status
        time.sleep(0.1)
    raise AssertionError("the full verification did not report in time")


def _cli_verify(stack: Stack) -> int:
    env = {**os.environ, "ENGRAM_HOME": str(stack.home),
           "ENGRAM_GOVERNANCE_ADDR": stack.address("governance"),
           "ENGRAM_TOKEN": stack.token("admin", roles=ADMIN)}
    return subprocess.run([sys.executable, "-m", "engram.cli.main", "gov", "chain", "verify"],
                          env=env, capture_output=True, timeout=120).returncode


def test_every_chain_tampering_is_found_at_start_and_by_verify(stack: Stack) -> None:
    """Criterion: 100% of tamperings found at start (NOT_SERVING) and by VerifyChain; the CLI
    exits 1 on each; 0 problems on the untouched chain."""
    rng = random.Random(16_05)
    _populate(stack, rng, writes=scale(30, 200))
    db_path = stack.db_path("governance")
    pristine = stack.home / "pristine"
    _save(db_path, pristine)
    cases = scale(len(TAMPERS), 10 * len(TAMPERS))
    stack.extra.setdefault("governance", {})["ENGRAM_LOG_LEVEL"] = "INFO"  # the check's outcome
    missed: list[str] = []
    for i in range(cases + 1):
        _restore(pristine, db_path)
        what = "untouched"
        if i:  # case 0 is the untouched chain: no false alarm
            with sqlite3.connect(db_path) as db:
                (n,) = db.execute("SELECT count(*) FROM witness_chain").fetchone()
                what = TAMPERS[(i - 1) % len(TAMPERS)](db, n, rng)
        process = stack.spawn("governance")
        _wait_answer(stack.address("governance"), process)
        status = _after_full_check(stack, process)
        with GovernanceClient(stack.address("governance"),
                              stack.token("admin", roles=ADMIN)) as gov:
            report = gov.verify_chain()
        cli = _cli_verify(stack) if i in (0, 1, 4) else None  # 0: untouched
        stack.stop("governance")
        if not i:
            assert (status, report.ok, list(report.problems), cli) == (1, True, [], 0)
            continue
        found_at_start = status == 2 and "WITNESS CHAIN BROKEN" in stack.log("governance")
        if not (found_at_start and not report.ok and report.problems and cli in (None, 1)):
            missed.append(f"{what}: health={status} ok={report.ok} cli={cli}")
        (stack.home / "governance" / "service.log").unlink()
    assert not missed, f"{len(missed)} of {cases} tamperings not found: {missed}"


def test_a_checkpoint_holder_rejects_a_rolled_back_or_forked_chain(stack: Stack) -> None:
    """Criterion: verify_extends is True for the honest later head, False for a rollback to an
    earlier copy of the store and for a fork written on that copy (which verifies by itself)."""
    rng = random.Random(5)
    _populate(stack, rng, writes=12)
    db_path = stack.db_path("governance")
    _save(db_path, stack.home / "early")
    stack.start("governance")
    stack.start("shard")
    admin = stack.token("admin", roles=ADMIN)
    with GovernanceClient(stack.address("governance"), admin) as gov:
        early = gov.checkpoint()
        with ShardClient(stack.address("shard"), stack.token("agent-9")) as shard:
            for i in range(5):
                shard.add(f"later fact {i}", run_id="r2", request_id=f"later-{i}")
        held = gov.checkpoint()
        assert held.length > early.length
        assert gov.verify_extends(early, held)
        assert not gov.verify_extends(held, early)
        forged = gpb.ChainCheckpoint(head="ab" * 32, length=held.length + 1)
        assert not gov.verify_extends(held, forged)
    stack.stop("shard")
    stack.stop("governance")

    _restore(stack.home / "early", db_path)  # the store rolled back behind the clients' backs
    stack.start("governance")
    with GovernanceClient(stack.address("governance"), admin) as gov:
        rolled_back = gov.checkpoint()
        assert gov.verify_chain().ok  # consistent by itself: only a checkpoint shows it
        assert not gov.verify_extends(held, rolled_back)
        stack.start("shard")
        with ShardClient(stack.address("shard"), stack.token("agent-8")) as shard:
            for i in range(10):
                shard.add(f"forked fact {i}", run_id="r3", request_id=f"fork-{i}")
        fork = gov.checkpoint()
        assert fork.length > held.length
        report = gov.verify_chain(since=held)
        assert report.ok is False and not report.extends_since
        assert not gov.verify_extends(held, fork)
        assert gov.verify_extends(early, fork)
