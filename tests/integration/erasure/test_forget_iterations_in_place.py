"""Erasing single iterations of a kept iteration log (docs/erasure.md, issue 17), through real
servers on SQLite and Postgres: ``engram forget --match`` tombstones the format-2 warm lines of
the iterations holding a planted marker (in a detail or in a summary field) wherever they are
kept (a sealed segment, the database), and deletes their hot ring entries and cold snapshots;
the log, its head and its other iterations are kept. Afterwards the marker, the erased lines'
salts and the plain SHA-256 of their details are in no byte under the data directories and
$ENGRAM_HOME and in no table; summaries and reconstructions return the tombstones, marked
erased; the chain verifies and counts them; carrying the erasure out again changes nothing."""

from __future__ import annotations

import secrets
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from engram.client import EngramRpcError
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.compactor.v1 import compactor_service_pb2 as cpb
from services.compactor.domain.warm_chain import detail_digest
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN, cli_for
from tests.integration.erasure.test_forget import _files_holding, _tables_holding
from tests.stack import full_stack

FLEET = "fleet-i"
SMALL_TIERS = {"hot_size": 3, "rotate_bytes": 1024, "snapshot_every": 4}
"""Segments of two or three lines, a cold snapshot every fourth iteration, three hot."""


def _iteration(n: int, marker: str) -> dict[str, object]:
    held = {4: {"detail": {"said": marker}}, 6: {"planDigest": f"plan-{marker}"},
            11: {"detail": {"quoted": marker.upper()}}}.get(n, {})
    return {"iter": n, "planDigest": f"p{n}", "status": "ok", "detail": {"n": n}, **held}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_forget_match_erases_iterations_in_place(
        backend: str, tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    urls = ({name: request.getfixturevalue("fresh_postgres_urls")()
             for name in ("shard", "governance", "artifacts", "compactor")}
            if backend == "postgres" else {})
    marker = "zqxline" + secrets.token_hex(6)
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    data = tmp_path / "data"
    with full_stack(data, engram_home, make_token, urls, governed=True,
                    compactor=SMALL_TIERS) as stack:
        with CompactorClient(stack.compactor.address, agent) as comp:
            lines = {n: comp.record("run-l", iteration_from_json(_iteration(n, marker))).summary
                     for n in range(1, 13)}
            before = comp.verify("run-l")
            assert before.ok and before.segments_checked >= 3 and before.snapshots_checked == 3
        held = {4: lines[4], 6: lines[6], 11: lines[11]}
        needles = [marker, *(line.salt for line in held.values()),
                   detail_digest('{"said":"' + marker + '"}', "null"),
                   detail_digest('{"quoted":"' + marker.upper() + '"}', "null")]
        # the scans below can fail: before the erasure they find the marker and the salts
        assert _files_holding([data / "cold"], [marker.encode()])  # a segment, a snapshot
        if backend == "sqlite":
            with closing(sqlite3.connect(data / "compactor.db")) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert _files_holding([data], [n.encode() for n in needles[:4]])
        else:
            assert _tables_holding(urls["compactor"], needles)

        with cli_for(stack, admin, monkeypatch) as run:
            dry = run("forget", "--match", marker, "--dry-run")
            assert {(i["kind"], i["id"], i["leaf_hash"]) for i in dry["would_erase"]} == {
                ("iteration", f"run-l:{n}", line.hash) for n, line in held.items()}
            assert dry["runs_holding_text"] == []  # nothing needs the whole log
            with CompactorClient(stack.compactor.address, admin) as comp:
                assert comp.reconstruct("run-l", 11).detail_json  # the dry run: nothing
            done = run("forget", "--match", marker, "--reason", "subject asked")
            assert done["iterations_erased"] == 3 and done["runs_holding_text"] == []
            assert done["erasures"][0]["iteration_logs"] == []  # the log is kept
            erasure_id = done["erasures"][0]["erasure_id"]
            again = run("forget", "--match", marker)
            assert (again["iterations_erased"], again["erasures"]) == (0, [])

        with CompactorClient(stack.compactor.address, admin) as comp:
            report = comp.verify("run-l")
            assert report.ok, report.problems
            assert (report.lines_checked, report.tombstoned) == (12, 3)
            assert (report.last_iteration, report.head_hash) == (12, lines[12].hash)
            summaries = {s.iteration: s for s in comp.summaries("run-l")}
            for n, line in held.items():
                erased = summaries[n]
                assert (erased.erasure_id, erased.erased_by) == (erasure_id, "op")
                assert erased.erase_time.ToMicroseconds() > 0
                assert (erased.plan_digest, erased.status, erased.salt) == ("", "", "")
                assert (erased.hash, erased.prev_hash, erased.detail_digest,
                        erased.summary_commitment) == (line.hash, line.prev_hash,
                                                       line.detail_digest,
                                                       line.summary_commitment)
                view = comp.reconstruct("run-l", n)
                assert view.source == cpb.DETAIL_SOURCE_SUMMARY_ONLY
                assert (view.detail_json, view.summary.erasure_id) == ("", erasure_id)
            for n in set(lines) - set(held):
                assert summaries[n] == lines[n]
            assert comp.reconstruct("run-l", 8).detail_json == '{"n":8}'  # its snapshot kept
            assert comp.reconstruct("run-l", 12).detail_json == '{"n":12}'  # hot
            assert [h.summary.iteration for h in comp.recent("run-l")] == [12, 10]
            assert not comp.find_iteration_logs(marker).runs
            resumed = comp.forget_iterations(erasure_id)  # carried out again: nothing changes
            assert (resumed.iterations_erased, resumed.already_erased) == (0, 3)
            assert {s.iteration: s for s in comp.summaries("run-l")} == summaries
            with pytest.raises(EngramRpcError) as taken:  # the log stays append-only
                comp.record("run-l", iteration_from_json(_iteration(4, "again")))
            assert taken.value.reason == "ITERATION_ERASED"
            after = comp.record("run-l", iteration_from_json(_iteration(13, "new"))).summary
            assert after.prev_hash == lines[12].hash
            assert comp.verify("run-l").ok

        if backend == "sqlite":
            assert _files_holding([data, engram_home], [n.encode() for n in needles]) == []
        else:
            assert _files_holding([data, engram_home], [n.encode() for n in needles]) == []
            assert _tables_holding(urls["compactor"], needles) == []
