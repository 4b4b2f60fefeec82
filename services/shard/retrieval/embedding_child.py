"""The embedder's child process (:class:`embedding_process.ProcessEmbedder` starts it; not
meant to be run by hand)::

    python -m services.shard.retrieval.embedding_child BACKGROUND_FD FOREGROUND_FD...

Each descriptor is one end of a socket pair the shard holds the other end of, framed as
``multiprocessing.connection`` frames them. The first message on the background pipe is what
to load: ``(spec, threads, int8, niceness, log_level)``; the child answers ``(True, (name,
dimension))`` once the model is loaded, or ``(False, error)``, and then serves each pipe
from its own thread until the shard closes it. Started as a plain subprocess, not through
``multiprocessing``: its spawn start method runs a resource-tracker process beside every
parent (12 MB, for semaphores and shared memory the embedder never uses), and this module
imports only what the model needs (no gRPC, no database), since each module is memory the
child holds for its lifetime.
"""

from __future__ import annotations

import os
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from services.shard.retrieval.model_dir import ModelSpec


def _serve(conn: Connection, model: Any, niceness: int) -> None:
    from services.common.priority import lower_this_thread

    lower_this_thread(niceness)
    while True:
        try:
            texts = conn.recv()
        except (EOFError, OSError):  # the shard closed the pipe or died: nothing left to do
            os._exit(0)
        try:
            reply: tuple[bool, Any] = (True, model.embed(texts))
        except Exception as error:  # report it to the caller; the child keeps serving
            reply = (False, f"{type(error).__name__}: {error}")
        conn.send(reply)


def serve(foreground: list[Connection], background: Connection, spec: ModelSpec | None,
          threads: int, int8: bool, niceness: int, log_level: str) -> None:
    """Load the model, say so on ``background``, then serve every pipe until it closes."""
    from services.common.logging_setup import configure_logging
    from services.common.memory import limit_arenas
    from services.shard.retrieval.embedding_onnx import onnx_encoder

    limit_arenas()  # as the services do (run_service): a fresh interpreter, not inherited
    configure_logging("shard-embedder", log_level)  # the same JSON lines as the shard's

    try:
        model = onnx_encoder(spec, threads=threads, int8=int8, pool_niceness=niceness,
                             build_apart=True)
    except Exception as error:
        background.send((False, f"{type(error).__name__}: {error}"))
        return
    background.send((True, (model.name, model.dimension)))
    workers = [
        threading.Thread(target=_serve, args=(conn, model, 0), daemon=True)
        for conn in foreground
    ]
    workers.append(threading.Thread(target=_serve, args=(background, model, niceness),
                                    daemon=True))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not all(arg.isdigit() for arg in argv):
        print("usage: python -m services.shard.retrieval.embedding_child BACKGROUND_FD "
              "FOREGROUND_FD... (started by the shard, not by hand)", file=sys.stderr)
        return 2
    background, *foreground = (Connection(int(fd)) for fd in argv)
    try:
        settings = background.recv()
    except (EOFError, OSError):  # the shard went away before saying what to load
        return 0
    serve(foreground, background, *settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
