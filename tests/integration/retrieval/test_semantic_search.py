"""Semantic and hybrid search through a real shard server, on SQLite and Postgres."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from engram.client import ShardClient
from services.shard.retrieval.embedding import TestEmbedderRefused
from services.shard.retrieval.embedding_process import ProcessEmbedder
from services.shard.server import build_shard_server
from services.shard.service import ShardService
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shard.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


def _serve(settings: ShardSettings, token: str) -> tuple[ShardClient, ShardService, object]:
    server, service = build_shard_server(settings)
    server.start()
    return ShardClient(server.address, token), service, server


def _caught_up(client: ShardClient) -> None:
    deadline = time.monotonic() + 60  # a bound on waiting, not a speed assertion
    while client.status().indexing_lag and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.status().indexing_lag == 0


@pytest.fixture
def settings(db_url: str, engram_home: Path) -> ShardSettings:
    return ShardSettings(home=engram_home, db_url=db_url, port=0, allow_ungated=True)


def _hold_indexing(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every batch of vectors waits (up to 60 s) until the returned event is set."""
    from services.shard.search.index import SearchIndex

    release = threading.Event()
    index_vectors = SearchIndex._index_vectors

    def held(index: SearchIndex, work: list[tuple[int, str, str, str]]) -> None:
        release.wait(60)
        index_vectors(index, work)

    monkeypatch.setattr(SearchIndex, "_index_vectors", held)
    return release


def test_semantic_finds_paraphrase_and_survives_restart(
    settings: ShardSettings, make_token: TokenFactory
) -> None:
    token = make_token("agent-sem", "fleet-sem")
    client, service, server = _serve(settings, token)
    try:
        client.add("The quarterly revenue report shows sales grew by twelve percent")
        target = client.add("My dog loves running on the beach every morning").record
        client.add("Kubernetes pods restart when the liveness probe fails")
        _caught_up(client)
        assert client.search("puppy playing by the sea", mode="lexical") == []
        semantic = client.search("puppy playing by the sea", mode="semantic")
        assert semantic[0].record.id == target.id
        hybrid = client.search("puppy playing by the sea", mode="hybrid")
        assert hybrid[0].record.id == target.id
    finally:
        server.stop(0)  # type: ignore[attr-defined]
    # A new process rebuilds its index from the stored vectors.
    client, service, server = _serve(settings, token)
    try:
        _caught_up(client)
        assert client.search("puppy playing by the sea", mode="semantic")[0].record.id == target.id
        assert service.search_engine.index is not None
        assert service.search_engine.index.indexed("fleet-sem") == 3
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def test_search_survives_the_embedder_child_dying(
    settings: ShardSettings, make_token: TokenFactory
) -> None:
    client, service, server = _serve(settings, make_token("agent-kill", "fleet-kill"))
    try:
        target = client.add("My dog loves running on the beach every morning").record
        client.add("Kubernetes pods restart when the liveness probe fails")
        _caught_up(client)
        embedder = service.search_engine.index.embedder  # type: ignore[union-attr]
        assert isinstance(embedder, ProcessEmbedder)
        first = embedder.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        # The search finds the child dead (or dying under its call), starts a new one and
        # is answered by it: the client never sees the outage.
        found = client.search("puppy playing by the sea", mode="semantic")
        assert found[0].record.id == target.id
        assert embedder.pid != first
        later = client.add("A cat sleeps on the warm windowsill all afternoon").record
        _caught_up(client)
        assert client.search("kitten napping in the sun", mode="semantic")[0].record.id == later.id
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def test_hash_embedder_is_refused_unless_marked_as_test(
    db_url: str, engram_home: Path, make_token: TokenFactory
) -> None:
    base = ShardSettings(
        home=engram_home, db_url=db_url, port=0, allow_ungated=True, embedder="hash"
    )
    with pytest.raises(TestEmbedderRefused):
        build_shard_server(base)
    client, _, server = _serve(
        base.model_copy(update={"allow_test_embedder": True}), make_token("agent-h", "fleet-h")
    )
    try:
        client.add("deterministic vectors for tests")
        _caught_up(client)
        assert client.search("deterministic vectors", mode="semantic")
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def test_a_record_committed_after_a_higher_seq_is_still_found(
    fresh_postgres_url: str, engram_home: Path, make_token: TokenFactory
) -> None:
    """Another replica's transaction takes a seq, this shard commits and reads a higher one,
    then the other transaction commits: its record must still be indexed and found.
    (Postgres only: SQLite admits one writer at a time, so it commits in seq order.)"""
    from services.shard.domain import records

    settings = ShardSettings(
        home=engram_home, db_url=fresh_postgres_url, port=0, allow_ungated=True
    )
    fleet, agent = "fleet-late", "agent-late"
    client, service, server = _serve(settings, make_token(agent, fleet))
    try:
        content = "the lighthouse keeper logs every passing ship"
        sha = records.content_hash(content)
        late = records.seal(
            records.Record(
                id=records.record_id(fleet, "", agent, sha),
                fleet_id=fleet,
                run_id="",
                agent_id=agent,
                content=content,
                content_hash=sha,
                record_hash="",
                domain="general",
                source="replica",
                importance=0.5,
                tags=(),
                metadata={},
                cross_refs=(),
                created_us=int(time.time() * 1_000_000),
            )
        )
        with service.db.session() as replica:
            service.repo.insert(replica, [late])
            replica.flush()  # the seq is taken; the transaction stays open
            client.add("harbour pilots board ships at dawn")
            assert [h.record.content for h in client.search("ships", mode="lexical")] == [
                "harbour pilots board ships at dawn"
            ]
        # The replica's transaction has committed, below the cursor.
        found = {h.record.id for h in client.search("ships", mode="lexical")}
        assert late.id in found
        _caught_up(client)
        assert client.search("lighthouse keeper", mode="semantic")[0].record.id == late.id
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def _written_under_minilm(settings: ShardSettings, token: str, tmp_path: Path,
                          name: str) -> tuple[str, Path]:
    """21 records embedded by minilm-fp32 (the target first), and an operator's directory
    holding the same model under another name (another identity): the id and the directory."""
    from services.shard.retrieval.embedding import default_minilm_dir

    operator_dir = tmp_path / name
    operator_dir.mkdir()
    for entry in default_minilm_dir().iterdir():
        (operator_dir / entry.name).symlink_to(entry)
    first = settings.model_copy(update={"embedder": "minilm-fp32", "embed_process": False})
    client, _service, server = _serve(first, token)
    try:
        target = client.add("My dog loves running on the beach every morning").record
        for i in range(20):
            client.add(f"Kubernetes note {i}: pods restart when the liveness probe fails")
        _caught_up(client)
        assert client.status().embedding_model == "all-MiniLM-L6-v2"
    finally:
        server.stop(0)  # type: ignore[attr-defined]
    return target.id, operator_dir


def test_a_new_model_re_embeds_every_record_and_never_mixes_vectors(
    settings: ShardSettings, make_token: TokenFactory, tmp_path: Path
) -> None:
    """Changing the model keeps search answering and re-embeds in the background: status
    names the model and counts what it has left; no vector of the old model is served as the
    new one's, and none is left behind."""
    from sqlalchemy import create_engine, text

    token = make_token("agent-model", "fleet-model")
    target_id, operator_dir = _written_under_minilm(settings, token, tmp_path, "operator-model")
    second = settings.model_copy(update={"embedder": str(operator_dir), "embed_int8": False,
                                         "embed_process": False})
    client, _service, server = _serve(second, token)
    try:
        status = client.status()
        assert status.embedding_model.startswith("operator-model@")
        # Answers meanwhile, by its lexical half at least.
        assert client.search("dog on the beach", mode="hybrid")[0].record.id == target_id
        _caught_up(client)
        assert client.search("puppy playing by the sea", mode="semantic")[0].record.id == \
            target_id
    finally:
        server.stop(0)  # type: ignore[attr-defined]
    engine = create_engine(settings.database_url())
    with engine.connect() as connection:
        models = connection.execute(text(
            "SELECT model, count(*) FROM record_vectors GROUP BY model")).all()
    engine.dispose()
    assert [(m, n) for m, n in models] == [(status.embedding_model, 21)]


def test_the_previous_model_serves_its_vectors_until_the_re_embedding_ends(
    settings: ShardSettings, make_token: TokenFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ENGRAM_SHARD_PREVIOUS_EMBEDDER naming the model the records were embedded with,
    semantic search finds them before the new model has re-embedded any (its queries embedded
    by both); once the re-embedding ends the previous model is let go. Checked: without the
    setting the paraphrase below found nothing while the re-embedding was held."""
    token = make_token("agent-prev", "fleet-prev")
    target_id, operator_dir = _written_under_minilm(settings, token, tmp_path,
                                                    "operator-model-2")
    release = _hold_indexing(monkeypatch)
    second = settings.model_copy(update={
        "embedder": str(operator_dir), "embed_int8": False, "embed_process": False,
        "previous_embedder": "minilm-fp32"})
    client, service, server = _serve(second, token)
    try:
        index = service.search_engine.index
        assert index is not None
        deadline = time.monotonic() + 30  # loaded in the background after the start
        while index.previous_held("fleet-prev") < 21 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.previous_held("fleet-prev") == 21
        status = client.status()
        assert status.indexing_lag == 21  # nothing re-embedded yet
        assert status.previous_embedding_model == "all-MiniLM-L6-v2"
        hits = client.search("puppy playing by the sea", mode="semantic")
        assert hits and hits[0].record.id == target_id
        assert client.search("puppy playing by the sea", mode="hybrid")[0].record.id == \
            target_id
        release.set()
        _caught_up(client)
        deadline = time.monotonic() + 30  # a bound on waiting, not a speed assertion
        while index.previous is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.previous is None, "the previous model was kept after the re-embedding"
        assert client.status().previous_embedding_model == ""
        assert client.search("puppy playing by the sea", mode="semantic")[0].record.id == \
            target_id
    finally:
        release.set()
        server.stop(0)  # type: ignore[attr-defined]
    # Started again with the setting left on: no vector of that model is left, so it is let
    # go at once rather than held in memory for good.
    client, service, server = _serve(second, token)
    try:
        index = service.search_engine.index
        assert index is not None
        deadline = time.monotonic() + 30  # looked for in the background after the start
        while index.previous is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.previous is None and index.previous_held("fleet-prev") == 0
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def _previous_settings(settings: ShardSettings, operator_dir: Path) -> ShardSettings:
    return settings.model_copy(update={
        "embedder": str(operator_dir), "embed_int8": False, "embed_process": False,
        "previous_embedder": "minilm-fp32"})


def test_the_previous_models_vectors_load_beside_the_indexer_and_outlive_a_database_error(
    settings: ShardSettings, make_token: TokenFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The load of the previous model's vectors does not hold up the indexer (it re-embeds
    while the load's first query hangs), and a query that fails is read again: the previous
    model is not let go for one database error. Checked failing with the load run inside the
    indexer before its loop, and with a failed page retiring the model."""
    import threading

    from sqlalchemy.exc import OperationalError

    from services.shard.repository import ShardRepository
    from services.shard.search import index as index_module
    from services.shard.search.index import SearchIndex

    token = make_token("agent-prev-load", "fleet-prev-load")
    target_id, operator_dir = _written_under_minilm(settings, token, tmp_path,
                                                    "operator-model-3")
    load_release, reembedding, reembed_release = (threading.Event() for _ in range(3))
    calls: list[int] = []
    real_page = ShardRepository.vectors_of_model
    reembed = SearchIndex._index_vectors

    def hanging_then_failing(repo: ShardRepository, session: object, model: str,
                             after: int, limit: int) -> list[object]:
        calls.append(after)
        if len(calls) == 1:  # the database hangs, then the query fails
            load_release.wait(60)
            raise OperationalError("SELECT", {}, Exception("server closed the connection"))
        return real_page(repo, session, model, after, limit)  # type: ignore[arg-type]

    def held(index: SearchIndex, work: list[tuple[int, str, str, str]]) -> None:
        reembedding.set()
        reembed_release.wait(60)
        reembed(index, work)

    monkeypatch.setattr(ShardRepository, "vectors_of_model", hanging_then_failing)
    monkeypatch.setattr(index_module, "PREVIOUS_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(SearchIndex, "_index_vectors", held)
    client, service, server = _serve(_previous_settings(settings, operator_dir), token)
    try:
        index = service.search_engine.index
        assert index is not None
        assert reembedding.wait(30), "the indexer waited for the previous vectors' load"
        load_release.set()
        deadline = time.monotonic() + 30  # a bound on waiting, not a speed assertion
        while index.previous_held("fleet-prev-load") < 21 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.previous_held("fleet-prev-load") == 21, "one failed query let it go"
        assert calls[:2] == [0, 0]  # the failed page was read again
        assert client.search("puppy playing by the sea", mode="semantic")[0].record.id == \
            target_id
        reembed_release.set()
        _caught_up(client)
        deadline = time.monotonic() + 30
        while index.previous is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.previous is None
    finally:
        load_release.set()
        reembed_release.set()
        server.stop(0)  # type: ignore[attr-defined]


def test_a_stop_ends_the_previous_models_load_between_pages(
    settings: ShardSettings, make_token: TokenFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shard stopped while it loads the previous model's vectors stops reading them (no
    query after the stop, so no connection held past it). Checked failing with the load
    reading on to its last page regardless of the stop."""
    import threading

    from services.shard.repository import ShardRepository
    from services.shard.search import index as index_module
    from services.shard.search.index import SearchIndex

    token = make_token("agent-prev-stop", "fleet-prev-stop")
    _target_id, operator_dir = _written_under_minilm(settings, token, tmp_path,
                                                     "operator-model-4")
    calls: list[int] = []
    real_page = ShardRepository.vectors_of_model

    def slow_page(repo: ShardRepository, session: object, model: str,
                  after: int, limit: int) -> list[object]:
        calls.append(after)
        time.sleep(0.5)  # 21 pages of one: about 10 s to load them all
        return real_page(repo, session, model, after, limit)  # type: ignore[arg-type]

    finished = threading.Event()  # no re-embedding: the previous vectors stay in the store
    monkeypatch.setattr(SearchIndex, "_index_vectors", lambda *_: finished.wait(60))
    monkeypatch.setattr(ShardRepository, "vectors_of_model", slow_page)
    monkeypatch.setattr(index_module, "PREVIOUS_PAGE", 1)
    _client, _service, server = _serve(_previous_settings(settings, operator_dir), token)
    stopped = False
    try:
        deadline = time.monotonic() + 30
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(calls) >= 2
        finished.set()
        server.stop(0)  # type: ignore[attr-defined]
        stopped = True
        after_stop = len(calls)
        time.sleep(1.5)
        assert len(calls) == after_stop, "the load went on reading after the shard stopped"
        assert after_stop < 21
    finally:
        finished.set()
        if not stopped:
            server.stop(0)  # type: ignore[attr-defined]


def test_records_already_re_embedded_get_no_vector_of_the_previous_model(
    settings: ShardSettings, make_token: TokenFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The load of the previous model's vectors hands over only those of records the current
    model has not embedded yet. A re-embedding replaces a record's stored vector, so an old
    vector reaches the loader only when the record is re-embedded between the page's read and
    its hand-over: here every record is, so none is held and the model is let go. Checked
    failing with every known record's old vector handed over (21 held for nothing)."""
    import threading

    from services.shard.repository import ShardRepository
    from services.shard.search.fleet_index import FleetIndex

    token = make_token("agent-prev-done", "fleet-prev-done")
    _target_id, operator_dir = _written_under_minilm(settings, token, tmp_path,
                                                     "operator-model-5")
    release = threading.Event()
    handed: list[int] = []
    real_page = ShardRepository.vectors_of_model
    real_add = FleetIndex.add_previous_vectors

    def read_before_the_re_embedding(repo: ShardRepository, session: object, model: str,
                                     after: int, limit: int) -> list[object]:
        rows = real_page(repo, session, model, after, limit)  # type: ignore[arg-type]
        release.wait(60)  # handed over once every record is re-embedded
        return rows

    def counted(index: FleetIndex, docs: list[int], vectors: object) -> None:
        handed.append(len(docs))
        real_add(index, docs, vectors)  # type: ignore[arg-type]

    monkeypatch.setattr(ShardRepository, "vectors_of_model", read_before_the_re_embedding)
    monkeypatch.setattr(FleetIndex, "add_previous_vectors", counted)
    client, service, server = _serve(_previous_settings(settings, operator_dir), token)
    try:
        index = service.search_engine.index
        assert index is not None
        _caught_up(client)  # every record re-embedded while the load's first page is held
        release.set()
        deadline = time.monotonic() + 30  # a bound on waiting, not a speed assertion
        while index.previous is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.previous is None
        assert sum(handed) == 0, f"{sum(handed)} old vectors held for re-embedded records"
    finally:
        release.set()
        server.stop(0)  # type: ignore[attr-defined]


def test_a_load_whose_pages_never_read_gives_up_and_the_model_is_let_go(
    settings: ShardSettings, make_token: TokenFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page query that fails every time (a broken table, a permission taken away) ends the
    load after PREVIOUS_GIVE_UP_SECONDS, so the re-embedding's end lets the previous model go;
    it was held for good, retried every 30 s. Checked failing with the give-up taken out."""
    from sqlalchemy.exc import OperationalError

    from services.shard.repository import ShardRepository
    from services.shard.search import index as index_module

    token = make_token("agent-prev-fail", "fleet-prev-fail")
    _target_id, operator_dir = _written_under_minilm(settings, token, tmp_path,
                                                     "operator-model-6")

    def failing(*_: object) -> list[object]:
        raise OperationalError("SELECT", {}, Exception("permission denied for record_vectors"))

    monkeypatch.setattr(ShardRepository, "vectors_of_model", failing)
    monkeypatch.setattr(index_module, "PREVIOUS_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(index_module, "PREVIOUS_RETRY_MAX_SECONDS", 0.05)
    monkeypatch.setattr(index_module, "PREVIOUS_GIVE_UP_SECONDS", 0.5)
    client, service, server = _serve(_previous_settings(settings, operator_dir), token)
    try:
        index = service.search_engine.index
        assert index is not None
        _caught_up(client)
        deadline = time.monotonic() + 30  # a bound on waiting, not a speed assertion
        while index.previous is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.previous is None, "a load that never reads a page kept the model"
    finally:
        server.stop(0)  # type: ignore[attr-defined]


def test_a_fleets_status_counts_only_its_own_records_waiting_for_vectors(
        settings: ShardSettings, make_token: TokenFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GetStatus's indexing_lag counted every fleet's records not yet embedded: a tenant saw
    the replica's backlog, and from it how fast other fleets write (found in the open list of
    issue 19). A fleet's status now counts its own; the metric stays replica-wide."""
    release = _hold_indexing(monkeypatch)
    busy = make_token("agent-busy", "fleet-busy")
    quiet = make_token("agent-quiet", "fleet-quiet")
    client, service, server = _serve(settings, busy)
    try:
        with ShardClient(server.address, quiet) as other:  # type: ignore[attr-defined]
            other.add("one note of the quiet fleet about its garden")
            for i in range(12):
                client.add(f"note {i} of the busy fleet about shipping containers")
            assert client.status().indexing_lag == 12  # nothing embedded while held
            assert other.status().indexing_lag == 1
            index = service.search_engine.index
            assert index is not None and index.lag() == 13  # the replica's, for its metric
            release.set()
            _caught_up(client)
            _caught_up(other)
    finally:
        release.set()
        server.stop(0)  # type: ignore[attr-defined]


def test_a_joined_model_embeds_with_every_part_and_re_embeds_what_one_model_wrote(
    settings: ShardSettings, make_token: TokenFactory
) -> None:
    """``minilm+minilm-fp32`` (the quality profile's shape, with two packaged models): every
    record re-embedded by both parts, each in its own child process; one vector a record
    under the joined identity, as long as both parts' together; queries answered by both;
    one part's child killed and replaced under a search; a restart serves them again."""
    from sqlalchemy import create_engine, text

    from services.shard.retrieval.embedding_concat import ConcatEmbedder

    token = make_token("agent-joined", "fleet-joined")
    client, _service, server = _serve(settings, token)
    try:
        target = client.add("My dog loves running on the beach every morning").record
        client.add("Kubernetes pods restart when the liveness probe fails")
        client.add("The quarterly revenue report shows sales grew by twelve percent")
        _caught_up(client)
    finally:
        server.stop(0)  # type: ignore[attr-defined]
    joined = settings.model_copy(update={"embedder": "minilm+minilm-fp32",
                                         "previous_embedder": "minilm"})
    client, service, server = _serve(joined, token)
    try:
        model = client.status().embedding_model
        assert model == "all-MiniLM-L6-v2-int8+all-MiniLM-L6-v2"
        _caught_up(client)
        assert client.search("puppy playing by the sea", mode="semantic")[0].record.id == \
            target.id
        embedder = service.search_engine.index.embedder  # type: ignore[union-attr]
        assert isinstance(embedder, ConcatEmbedder) and embedder.dimension == 768
        assert embedder.embed_started is not None  # queries go to both children at once
        part = embedder.parts[1]
        assert isinstance(part, ProcessEmbedder) and part.pid is not None
        first = part.pid
        os.kill(first, signal.SIGKILL)
        assert client.search("puppy playing by the sea", mode="semantic")[0].record.id == \
            target.id
        assert part.pid != first
    finally:
        server.stop(0)  # type: ignore[attr-defined]
    engine = create_engine(settings.database_url())
    with engine.connect() as connection:
        stored = connection.execute(text(
            "SELECT model, length(vector), count(*) FROM record_vectors "
            "GROUP BY model, length(vector)")).all()
    engine.dispose()
    assert [tuple(row) for row in stored] == [(model, 768 * 4, 3)]
    client, service, server = _serve(joined.model_copy(update={"previous_embedder": ""}), token)
    try:
        _caught_up(client)  # the stored vectors loaded (status counts them as they load)
        assert client.search("puppy playing by the sea", mode="semantic")[0].record.id == \
            target.id
    finally:
        server.stop(0)  # type: ignore[attr-defined]
