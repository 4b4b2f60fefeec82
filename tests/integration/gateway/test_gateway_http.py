"""The gateway over real HTTP in front of the real services: records, errors, auth,
artifacts streamed both ways, snapshots as NDJSON."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from typing import Any

import pytest
import requests

from tests.integration.gateway.conftest import Stack

pytestmark = pytest.mark.slow


def _auth(stack: Stack, agent: str = "agent-1", roles: tuple[str, ...] = ("agent",)
          ) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.tokens(agent, 'fleet-gw', roles)}"}


def test_create_get_and_search_a_record(stack: Stack, gateway_url: str) -> None:
    auth = _auth(stack)
    created = requests.post(f"{gateway_url}/v1/records", headers=auth, timeout=10, json={
        "record": {"content": "Lesson: transcoders map paths from annotations",
                   "runId": "run-gw", "importance": 0.7, "tags": ["http"]},
        "requestId": "gw-1"})
    assert created.status_code == 200, created.text
    record = created.json()["record"]
    assert created.json()["created"] is True
    assert record["agentId"] == "agent-1" and record["fleetId"] == "fleet-gw"

    got = requests.get(f"{gateway_url}/v1/records/{record['id']}", headers=auth, timeout=10)
    assert got.status_code == 200, got.text
    assert got.json()["record"]["recordHash"] == record["recordHash"]

    searched = requests.post(f"{gateway_url}/v1/records:search", headers=auth, timeout=10,
                             json={"query": "transcoders annotations", "limit": 5})
    assert searched.status_code == 200, searched.text
    assert record["id"] in [hit["record"]["id"] for hit in searched.json()["hits"]]
    # The GET binding of the same RPC, with query parameters (repeated and scalar).
    by_query = requests.get(f"{gateway_url}/v1/records:search", headers=auth, timeout=10,
                            params={"query": "transcoders", "limit": "3", "runId": "run-gw"})
    assert by_query.status_code == 200, by_query.text
    assert record["id"] in [hit["record"]["id"] for hit in by_query.json()["hits"]]
    listed = requests.get(f"{gateway_url}/v1/records", headers=auth, timeout=10,
                          params=[("tags", "http"), ("page_size", "10")])
    assert [r["id"] for r in listed.json()["records"]] == [record["id"]]


def test_a_service_error_is_status_json_with_its_http_code(stack: Stack,
                                                           gateway_url: str) -> None:
    answer = requests.post(f"{gateway_url}/v1/records", headers=_auth(stack), timeout=10,
                           json={"record": {"content": "bad importance", "importance": 3.0}})
    assert answer.status_code == 400
    status = answer.json()
    assert status["code"] == 3 and "importance" in status["message"]
    info = status["details"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["reason"] == "IMPORTANCE_OUT_OF_RANGE" and info["domain"] == "engram.dev"

    missing = requests.get(f"{gateway_url}/v1/records/{'0' * 64}", headers=_auth(stack),
                           timeout=10)
    assert missing.status_code == 404 and missing.json()["code"] == 5

    denied = requests.put(f"{gateway_url}/v1/domains/ops", headers=_auth(stack), timeout=10,
                          json={"description": "only admins may"})
    assert denied.status_code == 403 and denied.json()["code"] == 7


@pytest.mark.parametrize("body", [b"{not json", b'{"record": {"importance": "high"}}',
                                  b'{"record": {"nope": 1}}', b"[1, 2]",
                                  # nested past what the parser recurses into: was a 500
                                  b"[" * 200_000,
                                  b'{"record": {"metadata": ' + b'{"a": ' * 5000 + b"1"
                                  + b"}" * 5002,
                                  # past Python's 4,300-digit int limit: was a 500 (review)
                                  b'{"record": {"content": "x", "importance": ' + b"1" * 5000
                                  + b"}}"])
def test_malformed_json_or_a_wrong_type_is_400(stack: Stack, gateway_url: str,
                                               body: bytes) -> None:
    answer = requests.post(f"{gateway_url}/v1/records", headers={
        **_auth(stack), "Content-Type": "application/json"}, data=body, timeout=10)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == 3


def test_a_wrong_query_type_is_400_and_an_unknown_route_404(stack: Stack,
                                                            gateway_url: str) -> None:
    answer = requests.get(f"{gateway_url}/v1/records", params={"page_size": "ten"},
                          headers=_auth(stack), timeout=10)
    assert answer.status_code == 400 and answer.json()["code"] == 3
    nowhere = requests.get(f"{gateway_url}/v2/nothing", headers=_auth(stack), timeout=10)
    assert nowhere.status_code == 404
    assert nowhere.json()["details"][0]["reason"] == "ROUTE_NOT_FOUND"
    wrong_verb = requests.delete(f"{gateway_url}/v1/records", headers=_auth(stack), timeout=10)
    assert wrong_verb.status_code == 405 and "GET" in wrong_verb.headers["allow"]
    # A newline in a path variable (found by the fuzzer) is still answered as Status JSON.
    odd = requests.get(f"{gateway_url}/v1/records/%0Ax", headers=_auth(stack), timeout=10)
    assert odd.headers["content-type"] == "application/json" and odd.json()["code"] in (3, 5)


@pytest.mark.parametrize("header", ["Bearer \u00e9t\u00e9", "Bearer\tabc", "Bearer a\x7fb"])
def test_a_malformed_authorization_header_is_401_not_500(gateway_url: str,
                                                         header: str) -> None:
    # gRPC metadata cannot carry it: the channel failed and the caller saw a 500.
    for path in ("/v1/status", "/v1/runs/r/records:snapshot"):
        answer = requests.get(f"{gateway_url}{path}", timeout=10,
                              headers={"Authorization": header})
        if "\x7f" in header and answer.status_code == 400:
            # DEL is not allowed in a header value at all (RFC 9110): uvicorn's httptools
            # parser, when installed (uvicorn[standard], chromadb), refuses the request
            # before the app sees it; its h11 parser lets the app answer
            assert answer.text == "Invalid HTTP request received.", answer.text
            continue
        assert answer.status_code == 401, (path, answer.text)
        assert answer.json()["details"][0]["reason"] == "TOKEN_MALFORMED"


def test_no_token_is_401_from_the_service(gateway_url: str) -> None:
    answer = requests.get(f"{gateway_url}/v1/status", timeout=10)
    assert answer.status_code == 401
    assert answer.json()["code"] == 16
    forged = requests.get(f"{gateway_url}/v1/status", timeout=10,
                          headers={"Authorization": "Bearer not-a-token"})
    assert forged.status_code == 401


def test_upload_then_download_an_artifact_streamed(stack: Stack, gateway_url: str) -> None:
    auth = _auth(stack, "runner")
    started = requests.post(f"{gateway_url}/v1/runs", headers=auth, json={"runId": "run-blob"},
                            timeout=10)
    assert started.status_code == 200, started.text
    blob = os.urandom(3 * 1024 * 1024 + 17)

    def pieces() -> object:  # a generator body: requests sends it chunked, never whole
        for start in range(0, len(blob), 100_000):
            yield blob[start:start + 100_000]

    uploaded = requests.post(
        f"{gateway_url}/v1/runs/run-blob/artifacts", headers={
            **auth, "Content-Type": "application/x-test",
            "X-Engram-Sha256": hashlib.sha256(blob).hexdigest()},
        params={"step_id": "plan", "name": "out/blob.bin"}, data=pieces(), timeout=30)
    assert uploaded.status_code == 200, uploaded.text
    artifact = uploaded.json()["artifact"]
    assert artifact["hash"] == hashlib.sha256(blob).hexdigest()
    assert int(artifact["sizeBytes"]) == len(blob) and artifact["mimeType"] == "application/x-test"

    with requests.get(f"{gateway_url}/v1/artifacts/{artifact['artifactId']}:read",
                      headers=auth, stream=True, timeout=30) as download:
        assert download.status_code == 200
        assert download.headers["content-type"].startswith("application/x-test")
        assert download.headers["x-engram-sha256"] == artifact["hash"]
        assert int(download.headers["content-length"]) == len(blob)
        assert json.loads(download.headers["x-engram-artifact"])["path"] == artifact["path"]
        assert download.headers["x-content-type-options"] == "nosniff"
        assert download.headers["content-disposition"] == "attachment"
        digest = hashlib.sha256()
        for piece in download.iter_content(65536):
            digest.update(piece)
    assert digest.hexdigest() == artifact["hash"]

    # A media type with a header break in it was stored, and broke every later download.
    for bad in ("text/plain%0d%0aX-Evil:%201", "%E2%82%AC/x", "text"):
        refused = requests.post(
            f"{gateway_url}/v1/runs/run-blob/artifacts?step_id=plan&name=m.txt&mime_type={bad}",
            headers=auth, data=b"x", timeout=10)
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["details"][0]["reason"] == "INVALID_MIME_TYPE"

    wrong_hash = requests.post(
        f"{gateway_url}/v1/runs/run-blob/artifacts", headers={**auth, "X-Engram-Sha256": "0" * 64},
        params={"step_id": "plan", "name": "bad.bin"}, data=b"other bytes", timeout=10)
    assert 400 <= wrong_hash.status_code < 500, wrong_hash.text
    assert wrong_hash.json()["details"][0]["reason"]
    # A header the service refuses at once, with bytes still coming: its own 400, not a 500.
    for _ in range(5):
        no_name = requests.post(f"{gateway_url}/v1/runs/run-blob/artifacts", headers=auth,
                                params={"step_id": "plan"}, data=pieces(), timeout=30)
        assert no_name.status_code == 400, no_name.text


def test_snapshot_and_replay_are_ndjson(stack: Stack, gateway_url: str) -> None:
    auth = _auth(stack, "snapper")
    ids = []
    for n in range(3):
        made = requests.post(f"{gateway_url}/v1/records", headers=auth, timeout=10, json={
            "record": {"content": f"snapshot line {n}: distinct fact {n * 7}",
                       "runId": "run-snap"}})
        assert made.status_code == 200, made.text
        ids.append(made.json()["record"]["id"])
    with requests.get(f"{gateway_url}/v1/runs/run-snap/records:snapshot", headers=auth,
                      params={"verify": "true"}, stream=True, timeout=10) as snapshot:
        assert snapshot.status_code == 200
        assert snapshot.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in snapshot.iter_lines() if line]
    assert [line["record"]["id"] for line in lines] == ids

    requests.post(f"{gateway_url}/v1/runs", headers=auth, json={"runId": "run-ev"}, timeout=10)
    for kind in ("tool.called", "tool.returned"):
        appended = requests.post(f"{gateway_url}/v1/runs/run-ev/events", headers=auth,
                                 json={"type": kind, "payloadJson": "{\"n\": 1}"}, timeout=10)
        assert appended.status_code == 200, appended.text
    replay = requests.get(f"{gateway_url}/v1/runs/run-ev/events:replay", headers=auth,
                          timeout=10)
    events = [json.loads(line) for line in replay.text.splitlines()]
    assert [e["event"]["type"] for e in events][-2:] == ["tool.called", "tool.returned"]
    unknown = requests.get(f"{gateway_url}/v1/runs/no-such-run/events:replay", headers=auth,
                           timeout=10)
    assert unknown.status_code == 404, unknown.text


def test_compactor_and_governance_through_the_gateway(stack: Stack, gateway_url: str) -> None:
    auth = _auth(stack, "iter-agent")
    recorded = requests.post(f"{gateway_url}/v1/runs/run-it/iterations", headers=auth,
                             timeout=10, json={"iteration": {"planDigest": "p1",
                                                             "status": "ok"}})
    assert recorded.status_code == 200, recorded.text
    rebuilt = requests.get(f"{gateway_url}/v1/runs/run-it/iterations/1", headers=auth,
                           timeout=10)
    assert rebuilt.status_code == 200, rebuilt.text
    checkpoint = requests.get(f"{gateway_url}/v1/chain/checkpoint",
                              headers=_auth(stack, "gov", ("governor",)), timeout=10)
    assert checkpoint.status_code == 200, checkpoint.text


def test_a_service_down_is_503_naming_the_service_not_its_address(stack: Stack) -> None:
    from engram.gateway import Gateway, GatewayConfig
    from tests.integration.gateway.conftest import GatewayThread

    # A port bound and not listening for the whole test: connections are refused, and no other
    # test's server can take it meanwhile (closed before use, it was free for anyone).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
        addresses = {**stack.addresses, "compactor": closed}
        with GatewayThread(Gateway(GatewayConfig(addresses, timeout_seconds=5.0))) as url:
            answer = requests.get(f"{url}/v1/runs/r/iterations", headers=_auth(stack),
                                  timeout=10)
            assert answer.status_code == 503, answer.text
            status = answer.json()
            assert status["code"] == 14 and closed not in answer.text
            assert status["details"][0]["reason"] == "SERVICE_UNAVAILABLE"
            assert status["details"][0]["metadata"] == {"service": "compactor"}
            # The other services are unaffected.
            assert requests.get(f"{url}/v1/status", headers=_auth(stack), timeout=10).ok


def _stalled(url: str, path: str, auth: dict[str, str], body: bytes, length: int) -> str:
    """Send the headers and ``body`` of a ``length``-byte request, then nothing; the answer's
    status line and body (the gateway must answer while the client still owes bytes)."""
    host, port = url.removeprefix("http://").split(":")
    head = "".join(f"{k}: {v}\r\n" for k, v in {
        **auth, "Host": host, "Content-Length": str(length),
        "Content-Type": "application/octet-stream"}.items())
    with socket.create_connection((host, int(port)), timeout=15) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            piece = conn.recv(65536)
            if not piece:
                break
            answer += piece
    return answer.decode("latin-1")


def test_a_body_that_stops_coming_is_408_and_nothing_is_stored(stack: Stack) -> None:
    """A client that sends part of a body and then nothing held an upload thread (and its gRPC
    call) until it went away; 32 such clients stopped every upload. Now the body may idle for
    body_idle_seconds (checked: without it the read below times out after 15 s)."""
    from engram.gateway import Gateway, GatewayConfig
    from tests.integration.gateway.conftest import GatewayThread

    auth = _auth(stack, "runner")
    config = GatewayConfig(stack.addresses, timeout_seconds=10.0, body_idle_seconds=0.5,
                           body_min_bytes_per_s=0)  # the idle limit alone (rate: test_slow_http)
    with GatewayThread(Gateway(config)) as url:
        started = requests.post(f"{url}/v1/runs", headers=auth, json={"runId": "run-idle"},
                                timeout=10)
        assert started.status_code == 200, started.text
        upload = _stalled(url, "/v1/runs/run-idle/artifacts?step_id=s&name=slow.bin", auth,
                          b"x" * 1000, 1_000_000)
        assert upload.startswith("HTTP/1.1 408"), upload
        assert "BODY_IDLE_TIMEOUT" in upload
        record = _stalled(url, "/v1/records", auth, b'{"record": {"con', 200)
        assert record.startswith("HTTP/1.1 408") and "BODY_IDLE_TIMEOUT" in record, record
        listed = requests.get(f"{url}/v1/runs/run-idle/artifacts", headers=auth, timeout=10)
        assert listed.status_code == 200 and not listed.json().get("artifacts"), listed.text


def test_a_call_without_a_token_is_refused_before_its_body_is_read(gateway_url: str) -> None:
    """Found by a review (2026-11-29): an anonymous 8 MiB JSON body was read and parsed (a
    CPU-second, hundreds of MB) before the service refused the missing token. Now the 401
    comes while most of the announced body has not even been sent."""
    host, port = gateway_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v1/records HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 8000000\r\n\r\n" + b"{\"record\": {\"content\": \"")
        answer = b""
        while b"TOKEN_MISSING" not in answer:  # the head and the body may come apart
            piece = conn.recv(65536)
            if not piece:
                break
            answer += piece
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"TOKEN_MISSING" in answer


@pytest.mark.parametrize("header", ["Bearer " + "a" * 12_000, "Basic dXNlcjpwdw=="])
def test_a_header_longer_than_a_token_or_not_bearer_is_401_every_time(
        gateway_url: str, header: str) -> None:
    """A 12 KB token was 401 or 429 at random (gRPC's metadata soft limit), its 429 naming
    the metadata's sizes."""
    reasons = set()
    for _ in range(10):
        answer = requests.get(f"{gateway_url}/v1/status", timeout=10,
                              headers={"Authorization": header})
        assert answer.status_code == 401, answer.text[:200]
        assert "metadata" not in answer.text
        reasons.add(answer.json()["details"][0]["reason"])
    assert reasons == {"TOKEN_MALFORMED" if len(header) > 4096 else "TOKEN_MISSING"}


def test_a_body_over_the_services_message_limit_is_400_not_429(
        stack: Stack, gateway_url: str) -> None:
    """A 5 MB record is over the services' 4 MiB message limit: gRPC refused it
    RESOURCE_EXHAUSTED, which HTTP clients took for 429 and retried for ever."""
    answer = requests.post(f"{gateway_url}/v1/records", headers=_auth(stack), timeout=30,
                           json={"record": {"content": "x" * 5_000_000}})
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["details"][0]["reason"] == "BODY_TOO_LARGE"


def test_a_body_of_350_000_empty_objects_is_400_before_it_is_parsed(gateway_url: str) -> None:
    """1 MiB of ``{},`` (350,000 objects, ~65 MiB once parsed into messages) under a made-up
    token: refused by its count of values before the parse (an 8 MiB one took ~520 MiB)."""
    body = b'{"records":[' + b"{}," * 350_000 + b"{}]}"
    answer = requests.post(f"{gateway_url}/v1/records:batchCreate", data=body, timeout=60,
                           headers={"Authorization": "Bearer made.up.token",
                                    "Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["details"][0]["reason"] == "JSON_TOO_MANY_VALUES"


def test_an_answer_is_rendered_as_json_off_the_event_loop(
        stack: Stack, gateway_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of 1,000 records of control characters is 257 MB of JSON: rendered on the event
    loop it held every other request and /healthz for 0.76 s (found in review, 2026-11-30)."""
    import engram.gateway._app as app_module

    on_loop: list[bool] = []
    render = app_module.to_json

    def watched(message: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # a worker thread runs no loop
            on_loop.append(False)
        return render(message)

    monkeypatch.setattr(app_module, "to_json", watched)
    listed = requests.get(f"{gateway_url}/v1/records", headers=_auth(stack), timeout=10,
                          params={"page_size": "1"})
    assert listed.status_code == 200, listed.text
    assert on_loop == [False]
