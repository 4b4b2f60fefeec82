"""Format-2 manifests over real gRPC, on SQLite and Postgres (docs/erasure.md): a random id and
a salted commitment, so nothing left of an erased manifest confirms a guess of its content;
creating the same content again in the fleet still answers the first (by a digest keyed with
the fleet's secret), also when it was stored before as format 1; a changed byte is DATA_LOSS;
an import checks the commitment and refuses what does not commit."""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import event, select, update

from engram.artifacts.v1 import artifacts_service_pb2 as pb
from engram.client._errors import EngramRpcError
from engram.client.artifacts import ArtifactsClient
from services.artifacts.domain.chain import manifest_id, run_leaf
from services.artifacts.domain.entities import Manifest
from services.artifacts.erasure import RunEraser
from services.artifacts.tables import EvidenceRow, ManifestKeyRow, ManifestRow
from services.common.commitment import commitment
from services.common.erasure_source import ErasureOrder
from services.common.errors import FailedPrecondition
from tests.conftest import TokenFactory
from tests.integration.artifacts.conftest import RunningArtifacts


def _refused(call: Any, *args: Any, **kwargs: Any) -> EngramRpcError:
    with pytest.raises(EngramRpcError) as refused:
        call(*args, **kwargs)
    return refused.value


def test_a_manifest_has_a_random_id_and_a_salted_commitment_and_is_created_once(
        artifacts_server: RunningArtifacts) -> None:
    env = artifacts_server
    content = {"window": ["rec-1", "rec-2"], "why": "the user asked about invoices"}
    text = json.dumps(content, separators=(",", ":"), sort_keys=True)
    created = env.client.create_manifest(content)
    manifest = created.manifest
    assert created.created and manifest.format == 2 and len(manifest.salt) == 64
    assert manifest.content_json == text
    assert manifest.content_hash == commitment(manifest.salt, text.encode())
    plain = hashlib.sha256(text.encode()).hexdigest()
    assert manifest.content_hash != plain and manifest.manifest_id != manifest_id(text)
    assert manifest.manifest_id.startswith("mf_") and len(manifest.manifest_id) == 43
    # the same content again, by another agent of the fleet, at once from 8 threads
    other = env.client_for(agent="agent-2")
    again = other.create_manifest(content)
    assert (again.created, again.manifest) == (False, manifest)
    fresh = {"window": ["rec-3"]}
    with ThreadPoolExecutor(8) as pool:
        racing = list(pool.map(lambda _: env.client.create_manifest(fresh), range(8)))
    assert len({r.manifest.manifest_id for r in racing}) == 1
    assert sum(r.created for r in racing) == 1
    # another fleet's manifest of the same content is its own, under another id
    elsewhere = env.client_for(fleet="fleet-b").create_manifest(content).manifest
    assert elsewhere.manifest_id != manifest.manifest_id
    assert elsewhere.content_hash != manifest.content_hash
    assert env.client.get_manifest(manifest.manifest_id) == manifest
    with env.service.db.session() as session:
        keys = session.scalars(select(ManifestKeyRow.key)).all()
    assert len(keys) == 3 and plain not in keys  # keyed digests, not the content's hash


def test_a_format_1_manifest_answers_a_create_of_its_content_and_still_verifies(
        artifacts_server: RunningArtifacts) -> None:
    """A manifest stored before format 2 keeps its derived id (events name it by that)."""
    env = artifacts_server
    text = '{"files":["old.txt"]}'
    legacy = Manifest(fleet_id="fleet-a", manifest_id=manifest_id(text), run_id="",
                      content_json=text, content_hash=hashlib.sha256(text.encode()).hexdigest(),
                      created_us=1_700_000_000_000_000)
    with env.service.writing() as session:
        env.service.repository.add_manifest(session, legacy)
    again = env.client.create_manifest({"files": ["old.txt"]})
    assert not again.created and again.manifest.manifest_id == legacy.manifest_id
    assert again.manifest.format == 1 and again.manifest.salt == ""
    run_id = env.client.start_run("run-1").run.run_id
    assert env.client.resolve(run_id, "manifest", legacy.manifest_id).resolved


@pytest.mark.parametrize("column", ["content_json", "salt", "content_hash"])
def test_a_byte_changed_in_a_stored_manifest_is_data_loss(
        artifacts_server: RunningArtifacts, column: str) -> None:
    env = artifacts_server
    manifest = env.client.create_manifest({"window": ["rec-9"]}).manifest
    changed = {"content_json": '{"window":["rec-8"]}', "salt": "0" * 64,
               "content_hash": "0" * 64}[column]
    with env.service.writing() as session:
        session.execute(update(ManifestRow).where(
            ManifestRow.manifest_id == manifest.manifest_id).values({column: changed}))
    error = _refused(env.client.get_manifest, manifest.manifest_id)
    assert (error.code, error.reason) == (grpc.StatusCode.DATA_LOSS, "MANIFEST_HASH_MISMATCH")
    run_id = env.client.start_run("run-1").run.run_id
    assert not env.client.resolve(run_id, "manifest", manifest.manifest_id,
                                  critical=False).resolved
    kept = env.client.create_manifest({"window": ["rec-1"]}, run_id=run_id).manifest
    report = env.client.verify()  # the fleet's: the run's manifest and the one of no run
    assert report.manifests_checked == 2
    assert [(p.manifest_id, p.problem, p.expected_hash) for p in report.manifest_problems] == [
        (manifest.manifest_id, "MANIFEST_HASH_MISMATCH",
         changed if column == "content_hash" else manifest.content_hash)]
    of_run = env.client.verify(run_id)
    assert (of_run.manifests_checked, list(of_run.manifest_problems)) == (1, [])
    assert env.client.get_manifest(kept.manifest_id) == kept


def test_an_import_checks_a_manifest_s_commitment_and_finds_it_by_content_after(
        artifacts_server: RunningArtifacts, make_token: TokenFactory) -> None:
    env = artifacts_server
    origin = env.client_for(fleet="fleet-o").create_manifest({"window": ["rec-5"]}).manifest
    with ArtifactsClient(env.server.address, make_token("op", "fleet-a", ("admin",)),
                         timeout=30) as target:
        for bad, reason in (
                (replace_proto(origin, salt="1" * 64), "MANIFEST_HASH_MISMATCH"),
                (replace_proto(origin, content_json='{"window":["rec-6"]}'),
                 "MANIFEST_HASH_MISMATCH"),
                (replace_proto(origin, format=3), "MANIFEST_HASH_MISMATCH"),
                (replace_proto(origin, manifest_id="mf_short"), "MANIFEST_HASH_MISMATCH")):
            error = _refused(target.import_run_items, manifests=[bad])
            assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
        with env.service.db.session() as session:
            assert session.scalars(select(ManifestRow.manifest_id).where(
                ManifestRow.fleet_id == "fleet-a")).all() == []
        assert target.import_run_items(manifests=[origin]).created == 1
        assert target.import_run_items(manifests=[origin]).already_present == 1
        again = env.client.create_manifest({"window": ["rec-5"]})  # fleet-a's agent
        assert (again.created, again.manifest.manifest_id) == (False, origin.manifest_id)


def replace_proto(manifest: pb.Manifest, **fields: Any) -> pb.Manifest:
    changed = pb.Manifest()
    changed.CopyFrom(manifest)
    for name, value in fields.items():
        setattr(changed, name, value)
    return changed


def test_an_erased_manifest_takes_its_key_and_the_same_content_is_new_afterwards(
        artifacts_server: RunningArtifacts) -> None:
    """Erased alone (a manifest of no run) or with its run: no key row is left to find it by,
    so nothing left links its content to the id governance's erasure names; writing the same
    content again makes a new manifest (checked failing with the key rows left)."""
    env = artifacts_server
    loose = env.client.create_manifest({"window": ["rec-7"]}).manifest
    run_id = env.client.start_run("run-1").run.run_id
    owned = env.client.create_manifest({"window": ["rec-8"]}, run_id=run_id).manifest
    run = env.client.get_run(run_id)

    class Source:
        def erasure(self, erasure_id: str) -> ErasureOrder:
            return ErasureOrder(erasure_id, "fleet-a", "op", (
                ("manifest", loose.manifest_id, loose.content_hash),
                ("run", run_id, run_leaf(run.head_hash))))

    erased, _, _, gone = RunEraser(env.service, Source()).erase(
        "fleet-a", "era_" + "1" * 28, 1)
    assert (gone.manifests, [r.manifests for r in erased]) == (1, [1])
    with env.service.db.session() as session:
        assert session.scalars(select(ManifestKeyRow)).all() == []
    again = env.client.create_manifest({"window": ["rec-7"]})
    assert again.created and again.manifest.manifest_id != loose.manifest_id
    renewed = env.client.create_manifest({"window": ["rec-8"]})
    assert renewed.created and renewed.manifest.manifest_id != owned.manifest_id


def test_an_imported_manifest_under_another_content_s_derived_id_takes_no_create_of_it(
        artifacts_server: RunningArtifacts, make_token: TokenFactory) -> None:
    """A format-2 manifest may carry any id of the form: one imported under the id content X
    would have had as format 1, with content Y, is not what a create of X answers (it was:
    found in review)."""
    env = artifacts_server
    x, y = '{"window":["x"]}', '{"window":["EVIL"]}'
    salt = "ab" * 32
    forged = pb.Manifest(manifest_id=manifest_id(x), content_json=y,
                         content_hash=commitment(salt, y.encode()), format=2, salt=salt,
                         create_time=Timestamp(seconds=1_700_000_000))
    with ArtifactsClient(env.server.address, make_token("op", "fleet-a", ("admin",)),
                         timeout=30) as admin:
        assert admin.import_run_items(manifests=[forged]).created == 1
    made = env.client.create_manifest({"window": ["x"]})
    assert made.created and made.manifest.content_json == x
    assert made.manifest.manifest_id != forged.manifest_id


def test_an_erasure_of_loose_items_refuses_a_kept_run_s_and_changes_nothing_of_it(
        artifacts_server: RunningArtifacts) -> None:
    """A manifest of a kept run, or evidence citing a kept artifact, goes with its run only;
    an erasure naming one (or a wrong leaf beside an event erased in place) is refused whole:
    the event listed beside it is not erased either (it was: found in review). A manifest
    whose run is no longer stored is of no run: found and erased."""
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    owned = env.client.create_manifest({"window": ["owned"]}, run_id=run_id).manifest
    event = env.client.append_event(run_id, "said", {"text": "keep me"}).event
    loose = env.client.create_manifest({"window": ["loose"]}).manifest
    with env.service.writing() as session:  # left by a write that raced its run's erasure
        env.service.repository.add_manifest(session, Manifest(
            fleet_id="fleet-a", manifest_id="mf_" + "c" * 40, run_id="run-gone",
            content_json='{"window":["orphan"]}',
            content_hash=commitment("cd" * 32, b'{"window":["orphan"]}'), created_us=5,
            format=2, salt="cd" * 32))
    event_item = ("event", f"{run_id}:{event.seq}", event.hash)
    for items in ([("manifest", owned.manifest_id, owned.content_hash)],
                  [event_item, ("manifest", loose.manifest_id, "0" * 64)]):

        class Source:
            def erasure(self, erasure_id: str, listed: Any = tuple(items)) -> ErasureOrder:
                return ErasureOrder(erasure_id, "fleet-a", "op", listed)

        with pytest.raises(FailedPrecondition) as refused:
            RunEraser(env.service, Source()).erase("fleet-a", "era_" + "2" * 28, 1)
        assert refused.value.reason == "ERASURE_MISMATCH"
    assert env.client.get_manifest(owned.manifest_id) == owned
    assert env.client.get_manifest(loose.manifest_id) == loose
    (kept,) = env.client.list_events(run_id)
    assert kept.payload_json == event.payload_json and not kept.erasure_id
    page = RunEraser(env.service, None).find("fleet-a", "orphan", 10)
    assert [(i.kind, i.id) for i in page.loose] == [("manifest", "mf_" + "c" * 40)]


@pytest.mark.parametrize("kind", ["manifest", "evidence"])
def test_a_manifest_or_evidence_written_while_its_run_is_erased_goes_with_it(
        artifacts_server: RunningArtifacts, kind: str) -> None:
    """The write holds the run until it commits, as appends do: the erasure waits and then
    deletes it, or went first and the write is refused. Before (Postgres), a write that had
    read the run before the erasure committed stored its row after it: a run's manifest or
    evidence left behind with its run gone (found in review)."""
    env = artifacts_server
    run_id = env.client.start_run("run-1").run.run_id
    artifact = env.client.upload([b"bytes"], run_id=run_id, step_id="s1", name="a.txt")
    run = env.client.get_run(run_id)
    repository = env.service.repository
    adding = "add_manifest" if kind == "manifest" else "add_evidence"
    real_add = getattr(repository, adding)
    reached, go = threading.Event(), threading.Event()

    def held(*args: Any) -> Any:  # past the checks, before the row is added
        reached.set()
        go.wait(10)
        return real_add(*args)

    setattr(repository, adding, held)
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            if kind == "manifest":
                outcome["done"] = env.service.create_manifest("fleet-a", '{"secret":"jane"}',
                                                              run_id)
            else:
                outcome["done"] = env.service.create_evidence(
                    "fleet-a", "corpus", "index", "chunk", 0, 1, artifact.artifact_id,
                    '{"secret":"jane"}')
        except Exception as error:
            outcome["error"] = error

    class Source:
        def erasure(self, erasure_id: str) -> ErasureOrder:
            return ErasureOrder(erasure_id, "fleet-a", "op",
                                (("run", run_id, run_leaf(run.head_hash)),))

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    assert reached.wait(10)
    eraser = threading.Thread(target=lambda: RunEraser(env.service, Source()).erase(
        "fleet-a", "era_" + "4" * 28, 1))
    eraser.start()
    eraser.join(1)  # Postgres: waits for the run's row; SQLite: for the write lock
    go.set()
    writer.join(10)
    eraser.join(10)
    setattr(repository, adding, real_add)
    with env.service.db.session() as session:
        left = [*session.scalars(select(ManifestRow.manifest_id)),
                *session.scalars(select(EvidenceRow.evidence_id))]
    assert left == [] and not eraser.is_alive()


def test_an_import_reads_the_fleet_secret_once_a_call(
        artifacts_server: RunningArtifacts, make_token: TokenFactory) -> None:
    """Each format-2 manifest of an import call is keyed under the fleet's secret; the call
    reads it once, not once a manifest (it did: 500 reads for a batch of 500)."""
    env = artifacts_server
    origin = env.client_for(fleet="fleet-o")
    made = [origin.create_manifest({"window": [f"rec-{n}"]}).manifest for n in range(5)]
    env.client.create_manifest({"window": ["made here first"]})  # fleet-a's secret exists
    reads: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "fleet_secrets" in statement and statement.lstrip().upper().startswith("SELECT"):
            reads.append(statement)

    event.listen(env.service.db.engine, "before_cursor_execute", count)
    try:
        with ArtifactsClient(env.server.address, make_token("op", "fleet-a", ("admin",)),
                             timeout=30) as target:
            assert target.import_run_items(manifests=made).created == 5
    finally:
        event.remove(env.service.db.engine, "before_cursor_execute", count)
    assert len(reads) == 1, reads
