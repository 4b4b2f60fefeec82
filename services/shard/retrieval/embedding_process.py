"""The encoder in a child process: the model's Python work never takes the shard's GIL.

The shard serves gRPC in Python threads that share one interpreter lock. Embedding
a record (tokenise, pad, call ONNX Runtime, one text per run for the int8 model)
holds that lock for a fraction of each text, and a lowered-priority indexer
thread that holds it makes request threads wait (priority inversion): with the
indexer embedding in-process, 64 writes in flight reached ~710/s; with the same
work in another process, ~840/s. So the model lives in a child process (a fresh
interpreter running :mod:`embedding_child`, so it shares nothing with the gRPC server's
threads) and the shard talks to it over pipes:

- *foreground* pipes (queries, write-time dedup), each served by its own thread at
  normal priority, so a query never waits behind an indexing batch;
- one *background* pipe (the indexer), served at ``niceness`` lower priority,
  whose batches run on the embedder's own pool (also lowered).

Vectors are the in-process embedder's, bit for bit (same graph, same runtime). If
the child dies, the next call starts a new child. A foreground call that the death
broke is repeated once on the new child (embedding is pure); a background call
raises :class:`EmbedderUnavailable`, and the indexer puts its batch back and retries.
If the shard dies, the child reads end-of-file and exits.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import subprocess
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from services.common.errors import Unavailable
from services.shard.retrieval.embedding import Vectors
from services.shard.retrieval.model_dir import ModelSpec

_READY_TIMEOUT_S = 300.0  # building the int8 graph takes ~2 s; a loaded machine, far longer
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
"""The directory holding the ``services`` package."""


def _executable() -> str:
    """The interpreter multiprocessing would start (``set_executable`` is honoured)."""
    from multiprocessing import spawn

    return os.fsdecode(spawn.get_executable())


def _interpreter_flags() -> list[str]:
    """The shard's own interpreter flags (``-I``, ``-E``, ``-X ...``), as spawn passed them,
    and ``-P``: ``-m`` would otherwise put the working directory (the service's writable data
    directory, in the image) first on the child's import path."""
    return [*subprocess._args_from_interpreter_flags(), "-P"]  # type: ignore[attr-defined]


def _child_environment() -> dict[str, str]:
    """The shard's environment; the directory holding ``services`` first on PYTHONPATH when it
    is a source tree (an install into site-packages needs nothing added)."""
    import site

    environment = dict(os.environ)
    if _PACKAGE_ROOT not in site.getsitepackages():
        environment["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return environment


class EmbedderUnavailable(Unavailable):
    """The embedding child process exited or failed to start (gRPC UNAVAILABLE)."""

    default_reason = "EMBEDDER_UNAVAILABLE"


class _Child:
    """One running child and the parent's ends of its pipes."""

    def __init__(self, spec: ModelSpec | None, threads: int, int8: bool, niceness: int,
                 foreground: int, log_level: str) -> None:
        pairs = [multiprocessing.Pipe() for _ in range(foreground + 1)]
        child_ends = [pairs[-1][1], *(child for _, child in pairs[:-1])]  # background first
        fds = [end.fileno() for end in child_ends]
        try:
            self.process = subprocess.Popen(
                [_executable(), *_interpreter_flags(), "-m",
                 "services.shard.retrieval.embedding_child", *map(str, fds)],
                pass_fds=fds, stdin=subprocess.DEVNULL, env=_child_environment())
        except (OSError, ValueError) as error:
            for parent_end, _ in pairs:
                parent_end.close()
            raise EmbedderUnavailable(f"the embedder process could not be started: {error}") \
                from None
        finally:
            for end in child_ends:
                end.close()
        self.background = pairs[-1][0]
        self.free: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        for parent_end, _ in pairs[:-1]:
            self.free.put(parent_end)
        self.connections = [parent_end for parent_end, _ in pairs]
        self.background_lock = threading.Lock()
        with contextlib.suppress(OSError, ValueError):  # it died at once: the reply says so
            self.background.send((spec, threads, int8, niceness, log_level))
        if not self.background.poll(_READY_TIMEOUT_S):
            self.close()
            raise EmbedderUnavailable(
                f"the embedder process did not start in {_READY_TIMEOUT_S:.0f} s"
            )
        try:
            ok, value = self._receive(self.background)
        except EmbedderUnavailable:
            self.close()
            raise EmbedderUnavailable(
                f"the embedder process exited while starting (code {self.exitcode}); "
                "its error is in the log above"
            ) from None
        if not ok:
            self.close()
            raise EmbedderUnavailable(f"the embedder process could not load the model: {value}")
        self.name, self.dimension = value

    def call(self, conn: Connection, texts: Sequence[str]) -> Vectors:
        self.send(conn, texts)
        return self.reply(conn)

    def send(self, conn: Connection, texts: Sequence[str]) -> None:
        try:
            conn.send(list(texts))
        except (OSError, ValueError):
            raise self._gone() from None

    def reply(self, conn: Connection) -> Vectors:
        ok, value = self._receive(conn)
        if not ok:
            raise RuntimeError(f"the embedder process failed: {value}")
        vectors: Vectors = np.asarray(value, dtype=np.float32)
        return vectors

    def _receive(self, conn: Connection) -> tuple[bool, Any]:
        try:
            reply: tuple[bool, Any] = conn.recv()
        except (EOFError, OSError):
            raise self._gone() from None
        return reply

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def _join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)

    def _gone(self) -> EmbedderUnavailable:
        self._join(1)
        return EmbedderUnavailable(
            f"the embedder process exited (code {self.exitcode}); the next call "
            "starts a new one"
        )

    def close(self) -> None:
        for conn in self.connections:
            conn.close()
        self._join(5)
        if self.alive():
            self.process.kill()
            self._join(5)


class ProcessEmbedder:
    """An encoder on ONNX Runtime (default: the packaged MiniLM), in a child process (see the
    module docstring)."""

    for_tests_only = False

    def __init__(self, spec: ModelSpec | None = None, *, threads: int = 2, int8: bool = True,
                 niceness: int = 10, foreground: int = 2, log_level: str = "INFO") -> None:
        self._settings = (spec, threads, int8, niceness, max(1, foreground), log_level)
        self._lock = threading.Lock()
        self._closed = False
        self._child = _Child(*self._settings)
        self.name: str = self._child.name
        self.dimension: int = self._child.dimension

    @property
    def pid(self) -> int | None:
        return self._child.process.pid

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Foreground: a query or a write's dedup check, never behind an indexing batch."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        child = self._current()
        try:
            return self._foreground(child, texts)
        except EmbedderUnavailable:
            if child.alive():
                raise
            # The child died under this call. Embedding is pure, so the call is repeated
            # once, on the new child: a query never fails for a child that can be replaced.
            return self._foreground(self._current(), texts)

    @staticmethod
    def _foreground(child: _Child, texts: Sequence[str]) -> Vectors:
        conn = child.free.get()
        try:
            return child.call(conn, texts)
        finally:
            child.free.put(conn)

    def embed_started(self, texts: Sequence[str]) -> PendingVectors:
        """Foreground, in two halves: the texts go to the child now, from the caller's thread,
        and the vectors are read when the caller asks for them (:class:`PendingVectors`), so
        a search scores BM25 while the child embeds its query without a thread between them.
        The caller must end it (call it, or :meth:`PendingVectors.settle`): until then it
        holds one of the foreground pipes."""
        if not texts:
            return PendingVectors.ready(np.zeros((0, self.dimension), dtype=np.float32))
        child = self._current()
        conn = child.free.get()
        try:
            child.send(conn, texts)
        except EmbedderUnavailable:
            child.free.put(conn)
            return PendingVectors.ready(self.embed(texts))  # a new child, as embed() does
        return PendingVectors(self, child, conn, texts)

    def embed_background(self, texts: Sequence[str]) -> Vectors:
        """Background: the indexer's batches, at lower priority."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        child = self._current()
        with child.background_lock:
            return child.call(child.background, texts)

    def _current(self) -> _Child:
        child = self._child
        if child.alive():
            return child
        with self._lock:
            if self._closed:  # a call racing close() must not start a child nobody stops
                raise EmbedderUnavailable("the embedder was closed")
            if self._child is child:  # the first caller to find it dead starts the next one
                child.close()
                self._child = _Child(*self._settings)
            return self._child

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._child.close()


class PendingVectors:
    """Vectors of texts already sent to the embedder process on a foreground pipe: the first
    call waits for them (later calls give the same vectors or raise the same error). A child
    that died meanwhile is replaced and the texts embedded again, as
    :meth:`ProcessEmbedder.embed` does. Not thread-safe: one caller owns it."""

    def __init__(self, owner: ProcessEmbedder | None, child: _Child | None,
                 conn: Connection | None, texts: Sequence[str]) -> None:
        self._owner, self._child, self._conn, self._texts = owner, child, conn, texts
        self._vectors: Vectors | None = None
        self._error: BaseException | None = None

    @classmethod
    def ready(cls, vectors: Vectors) -> PendingVectors:
        pending = cls(None, None, None, ())
        pending._vectors = vectors
        return pending

    def __call__(self) -> Vectors:
        if self._conn is not None:
            self._receive()
        if self._error is not None:
            raise self._error
        assert self._vectors is not None
        return self._vectors

    def settle(self) -> None:
        """Read the reply if nobody asked for it (the pipe is then free for the next call)."""
        if self._conn is not None:
            self._receive()

    def _receive(self) -> None:
        owner, child, conn = self._owner, self._child, self._conn
        assert owner is not None and child is not None and conn is not None
        self._conn = None
        try:
            self._vectors = child.reply(conn)
        except EmbedderUnavailable as error:
            child.free.put(conn)
            conn = None
            if child.alive():
                self._error = error
            else:  # the child died under this call: once more on the new child
                try:
                    self._vectors = owner.embed(self._texts)
                except Exception as again:
                    self._error = again
        except Exception as error:
            self._error = error
        finally:
            if conn is not None:
                child.free.put(conn)
