"""Format-2 warm lines over real gRPC (SQLite and Postgres): recorded iterations carry their
format, salt and commitments; VerifyRun and ReconstructIteration find a changed salt or
commitment; ImportIterations re-checks them and refuses an altered one; a log of format-1
lines (an older bundle's, without the format field) imports, verifies and goes on in format 2."""

from __future__ import annotations

import json

import grpc
import pytest
import sqlalchemy as sa

from engram.client.compactor import CompactorClient, iteration_from_json
from engram.compactor.v1 import compactor_service_pb2 as pb
from services.common.canonical import canonical_json
from services.common.commitment import commitment, is_salt
from services.common.db import normalize_url
from services.common.server import EngramServer
from services.compactor.domain.warm_chain import (
    IterationInput,
    WarmLine,
    canonical_detail_content,
    genesis_hash,
)
from services.compactor.servicer import summary_pb
from tests.conftest import TokenFactory
from tests.integration.compactor.conftest import CompactorFactory, refused

RUN = "run-fmt"


def _iteration(n: int) -> pb.IterationInput:
    return iteration_from_json({
        "iter": n, "planDigest": f"plan-{n}", "status": "ok", "riskScore": n / 10,
        "startTs": "2026-11-28T10:00:00Z", "detail": {"step": n, "said": f"secret {n}"},
        "guardrails": {"lint": n % 2 == 0}})


def _change_line(db_url: str, iteration: int, field: str, value: object) -> None:
    engine = sa.create_engine(normalize_url(db_url))
    try:
        with engine.begin() as conn:
            for table in ("compactor_warm_lines", "compactor_hot"):
                stored = conn.execute(sa.text(f"SELECT line FROM {table} WHERE run_id = :r AND "
                                              "iteration = :n"),
                                      {"r": RUN, "n": iteration}).scalar_one()
                line = {**json.loads(stored), field: value}
                conn.execute(sa.text(f"UPDATE {table} SET line = :l WHERE run_id = :r AND "
                                     "iteration = :n"),
                             {"l": canonical_json(line), "r": RUN, "n": iteration})
    finally:
        engine.dispose()


def test_recorded_lines_are_format_2_and_commit_to_what_they_hold(
        compactor_for: CompactorFactory) -> None:
    client = compactor_for()
    recorded = [client.record(RUN, _iteration(n)).summary for n in range(1, 13)]
    assert all(s.format == 2 and is_salt(s.salt) for s in recorded)
    assert len({s.salt for s in recorded}) == 12
    assert list(client.summaries(RUN)) == recorded
    hot = client.reconstruct(RUN, 12)
    assert hot.source == pb.DETAIL_SOURCE_HOT and hot.summary == recorded[-1]
    assert hot.summary.detail_digest == commitment(
        hot.summary.salt, canonical_detail_content(hot.detail_json, hot.guardrails_json))
    assert client.record(RUN, _iteration(12)).created is False  # a retry, same salt kept
    report = client.verify(RUN)
    assert report.ok and report.head_hash == recorded[-1].hash, report


@pytest.mark.parametrize("field, value", [
    ("salt", "cd" * 32), ("salt", "not hex"), ("summaryCommitment", "0" * 64),
    ("detailDigest", "0" * 64), ("status", "failed")])
def test_a_changed_salt_commitment_or_field_is_found_by_verify_and_reconstruct(
        compactor_for: CompactorFactory, compactor_db_url: str, field: str,
        value: object) -> None:
    client = compactor_for()
    for n in range(1, 4):
        client.record(RUN, _iteration(n))
    _change_line(compactor_db_url, 2, field, value)
    report = client.verify(RUN)
    assert not report.ok and any("active line 2" in p.location for p in report.problems), report
    if field in ("salt", "detailDigest"):  # the hot detail no longer commits under the line
        error = refused(client.reconstruct, RUN, 2)
        assert (error.code, error.reason) == (grpc.StatusCode.DATA_LOSS, "DETAIL_TAMPERED")


def test_an_import_re_checks_salts_and_commitments(
        compactor_for: CompactorFactory, target: EngramServer,
        make_token: TokenFactory) -> None:
    origin = compactor_for()
    for n in range(1, 4):
        origin.record(RUN, _iteration(n))
    hot = {h.summary.iteration: h for h in origin.recent(RUN)}
    log = [pb.ImportedIteration(summary=h.summary, detail_json=h.detail_json,
                                guardrails_json=h.guardrails_json)
           for h in sorted(hot.values(), key=lambda h: h.summary.iteration)]

    def altered(**summary: object) -> pb.ImportedIteration:
        copy = pb.ImportedIteration()
        copy.CopyFrom(log[0])
        for name, value in summary.items():
            if name == "detail_json":
                copy.detail_json = str(value)
            else:
                setattr(copy.summary, name, value)
        return copy

    detail = '{"said":"another secret","step":1}'
    recommitted = commitment(log[0].summary.salt,
                             canonical_detail_content(detail, log[0].guardrails_json))
    with CompactorClient(target.address, make_token("op", "fleet-a", ("admin",))) as client:
        for item, reason in (
                (altered(salt="cd" * 32), "ITERATION_HASH_MISMATCH"),
                (altered(salt="CD" * 32), "INVALID_SALT"),
                (altered(summary_commitment="0" * 64), "ITERATION_HASH_MISMATCH"),
                (altered(format=3), "INVALID_FORMAT"),
                (altered(format=1), "INVALID_FORMAT"),  # a format-1 line holds no salt
                (altered(detail_json='{"step":99}'), "DETAIL_DIGEST_MISMATCH"),
                # the detail re-committed under the kept salt: the hash covers the commitment
                (altered(detail_json=detail, detail_digest=recommitted),
                 "ITERATION_HASH_MISMATCH")):
            error = refused(client.import_iterations, RUN, [item])
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, reason), \
                (reason, error.message)
        assert refused(client.verify, RUN).code == grpc.StatusCode.NOT_FOUND
        assert client.import_iterations(RUN, log).created == 3
        assert list(client.summaries(RUN)) == [item.summary for item in log]
        assert client.verify(RUN).ok


def test_an_older_bundles_format_1_log_imports_verifies_and_goes_on_in_format_2(
        target: EngramServer, make_token: TokenFactory) -> None:
    prev, log = genesis_hash("fleet-a", RUN), []
    for n in range(1, 7):
        item = IterationInput(
            iteration=n, plan_digest=f"plan-{n}", parent_digest="",
            start_ts="2026-11-28T10:00:00Z", end_ts="", files_touched=0, net_add=n, net_del=0,
            risk_score=0.5, status="ok", detail_json=f'{{"step":{n}}}',
            guardrails_json="null")
        line = WarmLine.chained(item, n, prev)  # format 1: as the compactor chained before
        summary = summary_pb(line)
        summary.ClearField("format")  # a bundle made before the field
        log.append(pb.ImportedIteration(summary=summary, detail_json=item.detail_json,
                                        guardrails_json=item.guardrails_json))
        prev = line.hash
    with CompactorClient(target.address, make_token("op", "fleet-a", ("admin",))) as client:
        assert client.import_iterations(RUN, log).created == 6
        stored = list(client.summaries(RUN))
        assert [s.format for s in stored] == [1] * 6 and not any(s.salt for s in stored)
        assert [s.hash for s in stored] == [item.summary.hash for item in log]
        assert client.reconstruct(RUN, 6).detail_json == '{"step":6}'
        nxt = client.record(RUN, _iteration(7)).summary
        assert nxt.format == 2 and nxt.prev_hash == log[-1].summary.hash
        report = client.verify(RUN)
        assert report.ok and report.last_iteration == 7, report
