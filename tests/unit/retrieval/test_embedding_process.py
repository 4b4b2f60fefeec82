"""MiniLM in a child process: the same vectors as in-process, restarts, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from services.shard.retrieval.embedding_onnx import OnnxBertEmbedder
from services.shard.retrieval.embedding_process import EmbedderUnavailable, ProcessEmbedder
from services.shard.server import embedding_provider
from services.shard.settings import ShardSettings

TEXTS = [
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "Melanie: Wow, that's cool! What made it so special?",
    "ok",
    "Deploy the shard with two replicas behind the load balancer, then run the migrations.",
]


@pytest.fixture(scope="module")
def child() -> Iterator[ProcessEmbedder]:
    embedder = ProcessEmbedder(threads=2, int8=True)
    yield embedder
    embedder.close()


@pytest.fixture(scope="module")
def in_process() -> OnnxBertEmbedder:
    return OnnxBertEmbedder(threads=1, int8=True)


def test_same_vectors_as_in_process_both_ways(
    child: ProcessEmbedder, in_process: OnnxBertEmbedder
) -> None:
    assert child.name == in_process.name == "all-MiniLM-L6-v2-int8"  # stored vectors match
    assert child.dimension == 384 and not child.for_tests_only
    expected = in_process.embed(TEXTS)
    assert np.array_equal(child.embed(TEXTS), expected)
    assert np.array_equal(child.embed_background(TEXTS * 5)[: len(TEXTS)], expected)
    assert child.embed([]).shape == child.embed_background([]).shape == (0, 384)


def test_the_child_loads_no_grpc_or_client(child: ProcessEmbedder) -> None:
    """Each module the child imports is memory it holds for its life: gRPC and the client's
    stubs (which logging once pulled in through tracing) cost it 16 MB of RSS."""
    child.embed(TEXTS)  # started and serving
    with open(f"/proc/{child.pid}/maps") as maps:
        mapped = maps.read()
    assert "cygrpc" not in mapped
    assert "onnxruntime" in mapped  # the right process: it holds the model


def test_concurrent_callers_get_their_own_rows(
    child: ProcessEmbedder, in_process: OnnxBertEmbedder
) -> None:
    expected = {text: row for text, row in zip(TEXTS, in_process.embed(TEXTS), strict=True)}
    failures: list[str] = []

    def ask(text: str, background: bool) -> None:
        for _ in range(10):
            call = child.embed_background if background else child.embed
            if not np.array_equal(call([text])[0], expected[text]):
                failures.append(text)

    threads = [threading.Thread(target=ask, args=(t, i % 2 == 0)) for i, t in enumerate(TEXTS * 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def _killed_during(embedder: ProcessEmbedder, call: Callable[[], object]) -> object:
    """What ``call`` returned or raised when the child was SIGKILLed 0.3 s into it."""
    first = embedder.pid
    assert first is not None
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # the test inspects it
            outcome.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    os.kill(first, signal.SIGKILL)
    worker.join(timeout=300)
    assert len(outcome) == 1, "the call neither returned nor raised"
    return outcome[0]


def test_a_dead_child_is_replaced_and_a_call_it_broke_says_so(
    in_process: OnnxBertEmbedder,
) -> None:
    embedder = ProcessEmbedder(threads=1, int8=True)
    try:
        first = embedder.pid
        long_batch = [f"{TEXTS[0]} {i}" for i in range(400)]  # ~1 s of work on one thread
        outcome = _killed_during(embedder, lambda: embedder.embed_background(long_batch))
        assert isinstance(outcome, EmbedderUnavailable) and "exited" in str(outcome)
        # The next call starts a new child and gets the same vectors as before.
        assert np.array_equal(embedder.embed(TEXTS), in_process.embed(TEXTS))
        assert embedder.pid not in (None, first)
        second = embedder.pid
    finally:
        embedder.close()
    assert not os.path.exists(f"/proc/{second}")  # closed and reaped


def test_a_closed_embedder_starts_no_child() -> None:
    """A call racing close() (a search holding the previous model as a re-embedding ends and
    lets it go) started a new child that nothing would ever stop; it is now refused.
    Checked failing without the closed flag (a new pid, alive)."""
    embedder = ProcessEmbedder(threads=1, int8=True)
    first = embedder.pid
    embedder.close()
    with pytest.raises(EmbedderUnavailable, match="closed"):
        embedder.embed(TEXTS)
    with pytest.raises(EmbedderUnavailable, match="closed"):
        embedder.embed_background(TEXTS)
    assert embedder.pid == first and not os.path.exists(f"/proc/{first}")


def test_a_query_the_death_broke_is_answered_by_the_next_child(
    in_process: OnnxBertEmbedder,
) -> None:
    embedder = ProcessEmbedder(threads=1, int8=True)
    try:
        first = embedder.pid
        long_batch = [f"{TEXTS[1]} {i}" for i in range(400)]  # ~1 s of work on one thread
        outcome = _killed_during(embedder, lambda: embedder.embed(long_batch))
        assert isinstance(outcome, np.ndarray), outcome
        assert embedder.pid not in (None, first)
        assert np.array_equal(outcome, in_process.embed(long_batch))
    finally:
        embedder.close()


def test_a_started_query_gives_the_same_vectors_and_frees_its_pipe(
    child: ProcessEmbedder, in_process: OnnxBertEmbedder
) -> None:
    """A search sends its query before scoring BM25 and reads it after (embed_started). Its
    pipe is free again once the vectors are read or the pending call is settled unread: with
    two foreground pipes, a third call would otherwise wait for good (checked: without
    settle() the loop below hangs on its third round)."""
    expected = in_process.embed(TEXTS)
    pending = child.embed_started(TEXTS)
    assert np.array_equal(pending(), expected)
    assert np.array_equal(pending(), expected)  # read once, kept
    pending.settle()  # nothing left to read: a no-op
    done = threading.Event()

    def unread_then_embed() -> None:
        for _ in range(5):  # more rounds than the embedder has foreground pipes
            child.embed_started([TEXTS[0]]).settle()
        assert np.array_equal(child.embed(TEXTS), expected)
        done.set()

    threading.Thread(target=unread_then_embed, daemon=True).start()
    assert done.wait(60), "a settled call kept its pipe"
    assert child.embed_started([]).__call__().shape == (0, 384)


def test_a_started_query_the_death_broke_is_answered_by_the_next_child(
    in_process: OnnxBertEmbedder,
) -> None:
    embedder = ProcessEmbedder(threads=1, int8=True)
    try:
        first = embedder.pid
        long_batch = [f"{TEXTS[3]} {i}" for i in range(400)]  # ~1 s of work on one thread
        outcome = _killed_during(embedder, lambda: embedder.embed_started(long_batch)())
        assert isinstance(outcome, np.ndarray), outcome
        assert embedder.pid not in (None, first)
        assert np.array_equal(outcome, in_process.embed(long_batch))
        assert np.array_equal(embedder.embed_started(TEXTS)(), in_process.embed(TEXTS))
    finally:
        embedder.close()
    with pytest.raises(EmbedderUnavailable, match="closed"):
        embedder.embed_started(TEXTS)


def _as_a_shard(then: str) -> subprocess.CompletedProcess[str]:
    """A process that starts a ProcessEmbedder ``e``, then runs ``then``."""
    script = ("import os\n"
              "from services.shard.retrieval.embedding_process import ProcessEmbedder\n"
              "e = ProcessEmbedder(threads=1, int8=True)\n" + then)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)


def test_the_child_exits_when_the_shard_dies() -> None:
    done = _as_a_shard("print(e.pid, flush=True)\nos.kill(os.getpid(), 9)\n")
    assert done.returncode == -signal.SIGKILL, done.stderr
    orphan = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{orphan}"):
        with open(f"/proc/{orphan}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, awaiting its reaper
                break
        time.sleep(0.05)
    else:
        assert not os.path.exists(f"/proc/{orphan}"), "the embedder child outlived the shard"


def test_the_embedder_is_the_shards_only_child_process() -> None:
    """No resource tracker beside it (multiprocessing's spawn started one, 12 MB, for
    semaphores the embedder never uses): one child, the embedder, named for what it is."""
    done = _as_a_shard(
        "me = str(os.getpid())\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        stat = open(f'/proc/{pid}/stat').read()\n"
        "        cmd = open(f'/proc/{pid}/cmdline').read().replace(chr(0), ' ')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if stat.rsplit(')', 1)[1].split()[1] == me:\n"
        "        print('child', cmd, flush=True)\n"
        "e.close()\n"
    )
    assert done.returncode == 0, done.stderr
    children = [line for line in done.stdout.splitlines() if line.startswith("child")]
    assert len(children) == 1, children
    assert "-m services.shard.retrieval.embedding_child" in children[0]


def test_a_child_that_cannot_be_started_is_embedder_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """UNAVAILABLE (a search ranks lexically, the indexer retries), not an OSError that would
    answer INTERNAL; and the parent's ends of the pipes are closed, not left to the GC."""
    from services.shard.retrieval import embedding_process

    opened: list[Any] = []
    real_pipe = embedding_process.multiprocessing.Pipe

    def pipe() -> Any:
        pair = real_pipe()
        opened.extend(pair)
        return pair

    monkeypatch.setattr(embedding_process.multiprocessing, "Pipe", pipe)
    monkeypatch.setattr(embedding_process, "_executable", lambda: "/nonexistent/python")
    with pytest.raises(EmbedderUnavailable, match="could not be started"):
        ProcessEmbedder(threads=1, int8=True)
    assert opened and all(end.closed for end in opened)


def test_the_child_runs_with_the_shards_interpreter_flags_and_not_from_its_directory() -> None:
    from services.shard.retrieval.embedding_process import _interpreter_flags

    done = subprocess.run([sys.executable, "-E", "-c",
                           "from services.shard.retrieval.embedding_process import "
                           "_interpreter_flags; print(_interpreter_flags())"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert "'-E'" in done.stdout and "'-P'" in done.stdout, done.stderr
    assert _interpreter_flags()[-1] == "-P"


def test_the_child_module_refuses_to_be_run_by_hand() -> None:
    done = subprocess.run([sys.executable, "-m", "services.shard.retrieval.embedding_child"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "started by the shard" in done.stderr


def test_the_shard_runs_minilm_in_a_child_by_default() -> None:
    provider = embedding_provider(ShardSettings(embedder="minilm", embed_threads=1))
    try:
        assert isinstance(provider, ProcessEmbedder) and provider.name == "all-MiniLM-L6-v2-int8"
    finally:
        assert isinstance(provider, ProcessEmbedder)
        provider.close()
