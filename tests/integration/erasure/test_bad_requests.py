"""The erasure RPCs of artifacts and the compactor, and GetErasure, with bad input and with
tokens that must be refused: the status and reason a client can act on, nothing erased."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from engram.client.compactor import CompactorClient, iteration_from_json
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as gpb
from tests.conftest import TokenFactory
from tests.integration.bundle.conftest import ADMIN
from tests.stack import full_stack

FLEET = "fleet-x"
INVALID, NOT_FOUND, DENIED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                              grpc.StatusCode.PERMISSION_DENIED)


def _refused(call: object, *args: object, **kwargs: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(EngramRpcError) as refused:
        call(*args, **kwargs)  # type: ignore[operator]
    return refused.value.code, refused.value.reason


def test_erasure_rpcs_refuse_bad_input_and_the_wrong_callers(
        tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> None:
    admin, agent = make_token("op", FLEET, ADMIN), make_token("scout-1", FLEET)
    with full_stack(tmp_path / "data", engram_home, make_token, governed=True) as stack:
        with ArtifactsClient(stack.artifacts.address, agent) as art:
            art.start_run("run-x", {})
            head = art.append_event("run-x", "tool.called", {"q": "kept"})
        with CompactorClient(stack.compactor.address, agent) as comp:
            comp.record("run-x", iteration_from_json({"iter": 1, "planDigest": "p",
                                                      "status": "ok"}))
        with GovernanceClient(stack.governance.address, make_token("op", "fleet-y", ADMIN)) as g:
            foreign = g.record_erasure("run", "run-x", [gpb.ErasedItem(
                kind="run", id="run-x", leaf_hash="ab" * 32)]).erasure.erasure_id
        with GovernanceClient(stack.governance.address, admin) as gov:
            assert _refused(gov.erasure, "../etc") == (INVALID, "INVALID_IDENTIFIER")
            assert _refused(gov.erasure, "era_none")[0] == NOT_FOUND
            assert _refused(gov.erasure, foreign)[0] == NOT_FOUND  # another fleet's: absent

        with ArtifactsClient(stack.artifacts.address, admin) as art:
            assert _refused(art.forget_runs, "")[0] == INVALID
            assert _refused(art.forget_runs, "era_none")[0] == NOT_FOUND
            # another fleet's: absent, as governance says it (nothing of that fleet named)
            assert _refused(art.forget_runs, foreign) == (NOT_FOUND, "ERASURE_NOT_FOUND")
            for match, limit, reason in (("", 0, "INVALID_SELECTOR"),
                                         ("x" * 1001, 0, "INVALID_SELECTOR"),
                                         ("kept", 10_001, "INVALID_LIMIT"),
                                         ("kept", -1, "INVALID_LIMIT")):
                assert _refused(art.find_runs, match, limit) == (INVALID, reason)
            assert [r.run_id for r in art.find_runs("KEPT").runs] == ["run-x"]
        with CompactorClient(stack.compactor.address, admin) as comp:
            assert _refused(comp.forget_iterations, "")[0] == INVALID
            assert _refused(comp.forget_iterations, foreign) == (NOT_FOUND, "ERASURE_NOT_FOUND")
            assert _refused(comp.find_iteration_logs, "", 0) == (INVALID, "INVALID_SELECTOR")
            assert _refused(comp.find_iteration_logs, "p", 10_001) == (INVALID, "INVALID_LIMIT")

        with ArtifactsClient(stack.artifacts.address, agent) as art:  # agents may not
            assert _refused(art.forget_runs, foreign) == (DENIED, "ROLE_REQUIRED")
            assert _refused(art.find_runs, "kept") == (DENIED, "ROLE_REQUIRED")
            assert art.get_run("run-x").head_hash == head.event.hash  # nothing erased
        with CompactorClient(stack.compactor.address, agent) as comp:
            assert _refused(comp.forget_iterations, foreign) == (DENIED, "ROLE_REQUIRED")
            assert _refused(comp.find_iteration_logs, "p") == (DENIED, "ROLE_REQUIRED")
            assert comp.verify("run-x").last_iteration == 1
