"""A warm single-record write sends only statements SQLAlchemy has compiled before.

Compiling a statement costs a write more than running it: the dialects' ``ON CONFLICT``
inserts are never cached, and the write-key claim built one per write took a fifth of an
ungated write (cProfile, in process). Every statement of a warm write must come from the
compiled cache (or be sent to the driver as it stands, like ``BEGIN IMMEDIATE``); one compiled
anew fails the test and names it. (Checked failing with the write-key claim back in its dialect
form.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from services.common.db import Database
from services.common.tokens import Principal
from services.shard.domain.records import RecordDraft
from services.shard.service import ShardService

WHO = Principal(agent_id="agent-a", fleet_id="fleet-a", roles=frozenset({"agent"}))


@contextmanager
def compiled_anew(db: Database) -> Iterator[list[str]]:
    """The SQL of every statement sent to ``db`` inside the block that was not a cache hit."""
    missed: list[str] = []
    writer = threading.get_ident()  # a write runs in its caller's thread (its group's leader)

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        if threading.get_ident() != writer:  # the background indexer's own statements
            return
        compiled = getattr(context, "compiled", None)
        if compiled is not None and context.cache_hit is not context.dialect.CACHE_HIT:
            missed.append(statement)

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield missed
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def test_a_warm_single_write_compiles_no_statement(shard: tuple[str, ShardService]) -> None:
    _address, service = shard
    for serial in range(3):  # warm: every statement of both paths compiled once
        service.write(WHO, [RecordDraft(f"warming note {serial}", run_id="run-1")],
                      request_id=f"warm-{serial}")
    service.write(WHO, [RecordDraft("warming note 0", run_id="run-1")])  # lands on its record
    with compiled_anew(service.db) as missed:
        for serial in range(5):
            results = service.write(WHO, [RecordDraft(f"note number {serial}", run_id="run-1")],
                                    request_id=f"write-{serial}")
            assert results[0].created
        # The same text again lands on its record (write key found, nothing stored).
        again = service.write(WHO, [RecordDraft("note number 0", run_id="run-1")])
        assert not again[0].created
    assert not missed, "compiled anew on a warm write:\n" + "\n".join(missed)
