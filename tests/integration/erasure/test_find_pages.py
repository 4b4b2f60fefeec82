"""FindRuns and FindIterationLogs page through a fleet's runs with signed page tokens: every run
holding the text is listed once across the pages, a run whose items fill a page goes on past
them (even when those items were erased before the next page was asked for), and a token is
good only for its own text and caller."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from services.artifacts import erasure as artifacts_erasure
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN
from tests.integration.erasure.test_bad_requests import _refused
from tests.stack import full_stack

FLEET = "fleet-pages"


def test_finds_page_through_every_run_and_refuse_tokens_of_another_text_or_caller(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    other_admin = make_token("op-2", FLEET, ADMIN)
    runs = [f"run-{n}" for n in range(5)]
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art, \
                CompactorClient(stack.compactor.address, agent) as comp:
            for n, run_id in enumerate(runs):
                art.start_run(run_id, {})
                art.append_event(run_id, "said", {"text": "zqxpaged" if n != 2 else "plain"})
                comp.record(run_id, iteration_from_json({
                    "iter": 1, "planDigest": "zqxpaged" if n != 2 else "p", "status": "ok"}))

        with ArtifactsClient(stack.artifacts.address, admin) as art:
            listed, tokens = [], [""]
            while True:
                page = art.find_runs("zqxpaged", 2, page_token=tokens[-1])
                assert page.more == bool(page.next_page_token)
                listed += [r.run_id for r in page.runs]
                if not page.next_page_token:
                    break
                tokens.append(page.next_page_token)
            assert listed == ["run-0", "run-1", "run-3", "run-4"] and len(tokens) == 2
            first_token = tokens[1]
            # the token is bound to its text, its caller and the scan
            assert _refused(art.find_runs, "other", 2, page_token=first_token) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
            assert _refused(art.find_runs, "zqxpaged", 2, page_token="garbage") == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
            assert _refused(art.find_runs, "zqxpaged", 2, page_token=first_token[:-2]) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
        with ArtifactsClient(stack.artifacts.address, other_admin) as art:
            assert _refused(art.find_runs, "zqxpaged", 2, page_token=first_token) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
        with ArtifactsClient(stack.artifacts.address, make_token("op", "fleet-other", ADMIN)) \
                as art:
            assert _refused(art.find_runs, "zqxpaged", 2, page_token=first_token) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")

        with CompactorClient(stack.compactor.address, admin) as comp:
            page = comp.find_iteration_logs("zqxpaged", 3)
            assert [r.run_id for r in page.runs] == ["run-0", "run-1", "run-3"] and page.more
            rest = comp.find_iteration_logs("zqxpaged", 3, page_token=page.next_page_token)
            assert ([r.run_id for r in rest.runs], rest.more, rest.next_page_token) == (
                ["run-4"], False, "")
            assert _refused(comp.find_iteration_logs, "zqxother", 3,
                            page_token=page.next_page_token) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
            # a FindRuns token is not a FindIterationLogs one (another service's secret too)
            assert _refused(comp.find_iteration_logs, "zqxpaged", 3,
                            page_token=first_token)[1] == "INVALID_PAGE_TOKEN"
        with CompactorClient(stack.compactor.address, other_admin) as comp:
            assert _refused(comp.find_iteration_logs, "zqxpaged", 3,
                            page_token=page.next_page_token) == (
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")


def test_a_run_whose_items_fill_a_page_goes_on_past_them_even_once_they_are_erased(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One run holds more matching events than a page lists (3 here, standing for 10,000):
    the next page lists the rest of them, then the next run; erasing the first page's events
    before asking for the next does not make it skip any."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    monkeypatch.setattr(artifacts_erasure, "MAX_ERASURE_ITEMS", 3)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-big", {})
            for n in range(7):
                art.append_event("run-big", "said", {"text": f"zqxfull {n}"})
            art.start_run("run-next", {})
            art.append_event("run-next", "said", {"text": "zqxfull"})
        with ArtifactsClient(stack.artifacts.address, admin) as art, \
                GovernanceClient(stack.governance.address, admin) as gov:
            seen: list[str] = []
            token = ""
            while True:
                page = art.find_runs("zqxfull", page_token=token)
                items = [i for r in page.runs for i in r.items]
                assert len(items) <= 3
                seen += [i.id for i in items]
                if items:  # erase what this page listed before asking for the next
                    erasure = gov.record_erasure("match", "", [gpb.ErasedItem(
                        kind=i.kind, id=i.id, leaf_hash=i.leaf_hash) for i in items]).erasure
                    assert art.forget_runs(erasure.erasure_id).events_erased == len(items)
                token = page.next_page_token
                if not token:
                    break
            assert seen == [f"run-big:{n}" for n in range(1, 8)] + ["run-next:1"]
            assert not art.find_runs("zqxfull").runs


def test_items_of_no_run_follow_the_runs_page_by_page_and_a_wrong_leaf_erases_nothing(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Manifests built for no run and evidence citing no artifact are listed after the runs
    (3 items a page here, standing for 10,000), each once even when the ones listed before
    were erased before the next page was asked for; a manifest item whose leaf is not its
    content hash, or an evidence item whose leaf is not zeros, is refused and nothing of the
    erasure is deleted."""
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    other_fleet = make_token("scout-9", "fleet-other")
    monkeypatch.setattr(artifacts_erasure, "MAX_ERASURE_ITEMS", 3)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-a", {})
            art.append_event("run-a", "said", {"text": "zqxloose"})
            manifests = [art.create_manifest({"n": n, "said": "ZQXLOOSE"}).manifest
                         for n in range(4)]
            art.create_manifest({"said": "zqxloose"}, run_id="run-a")  # goes with its run
            art.create_manifest({"said": "plain"})
            evidence = [art.create_evidence("corpus", "index", f"chunk-{n}", 0, 1,
                                            metadata={"q": "zqxloose"}).evidence
                        for n in range(2)]
            evidence.append(art.create_evidence("corpus", "index", "zqxloose-chunk", 0, 1)
                            .evidence)
        with ArtifactsClient(stack.artifacts.address, other_fleet) as art:
            art.create_manifest({"said": "zqxloose"})  # another fleet's: never listed
        with ArtifactsClient(stack.artifacts.address, admin) as art, \
                GovernanceClient(stack.governance.address, admin) as gov:
            first = art.find_runs("zqxloose")
            assert [r.run_id for r in first.runs] == ["run-a"]
            manifest = first.loose_items[0]
            for wrong in (gpb.ErasedItem(kind="manifest", id=manifest.id, leaf_hash="1" * 64),
                          gpb.ErasedItem(kind="evidence", id=evidence[0].evidence_id,
                                         leaf_hash=manifest.leaf_hash)):
                erasure = gov.record_erasure("match", "", [gpb.ErasedItem(
                    kind=manifest.kind, id=manifest.id, leaf_hash=manifest.leaf_hash),
                    wrong] if wrong.kind == "evidence" else [wrong]).erasure
                assert _refused(art.forget_runs, erasure.erasure_id) == (
                    grpc.StatusCode.FAILED_PRECONDITION, "ERASURE_MISMATCH")
            assert art.get_manifest(manifest.id).content_json  # nothing deleted
            seen: list[tuple[str, str]] = []
            page = first
            while True:
                loose = list(page.loose_items)
                assert len(loose) + sum(len(r.items) for r in page.runs) <= 3
                seen += [(i.kind, i.id) for i in loose]
                if loose:
                    erasure = gov.record_erasure("match", "", [gpb.ErasedItem(
                        kind=i.kind, id=i.id, leaf_hash=i.leaf_hash) for i in loose]).erasure
                    done = art.forget_runs(erasure.erasure_id)
                    assert done.manifests_erased + done.evidence_erased == len(loose)
                    again = art.forget_runs(erasure.erasure_id)
                    assert (again.manifests_erased, again.evidence_erased,
                            again.items_already_erased) == (0, 0, len(loose))
                if not page.next_page_token:
                    break
                page = art.find_runs("zqxloose", page_token=page.next_page_token)
            assert seen == [("manifest", m.manifest_id) for m in sorted(
                manifests, key=lambda m: (m.create_time.ToMicroseconds(), m.manifest_id))] + [
                ("evidence", e.evidence_id) for e in sorted(
                    evidence, key=lambda e: (e.create_time.ToMicroseconds(), e.evidence_id))]
            after = art.find_runs("zqxloose")
            assert [r.run_id for r in after.runs] == ["run-a"] and not after.loose_items
