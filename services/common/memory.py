"""Give freed heap memory back to the operating system (glibc ``malloc_trim``).

Building a model allocates far more than it keeps (the int8 MiniLM: ~500 MB at
peak while the float graph is quantized, ~150 MB after). glibc keeps freed
blocks in the process for reuse, so without a trim the process stays at its
peak; one trim after such a build returned ~125 MB. Elsewhere (musl, macOS), a
no-op.

Each service also caps glibc's malloc arenas (:func:`limit_arenas`): by default glibc gives
each new thread its own arena, up to eight per core, and a service's worker, gRPC and
indexer threads each keep theirs half-empty.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Mapping
from typing import Any

M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the arena cap (malloc.h)."""

ARENAS = 2
"""The cap a service sets unless ``MALLOC_ARENA_MAX`` is in its environment (glibc reads that
itself). Measured (shard, int8 MiniLM, 10k records then 300 searches, 2026-11-28): 243 MB
RSS with glibc's default, 213 MB with 2."""


def _glibc_function(name: str) -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return getattr(libc, name)
    except (OSError, AttributeError):  # not glibc
        return None


def trim_heap() -> bool:
    """Return free heap pages to the OS; True if glibc did so."""
    trim = _glibc_function("malloc_trim")
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))


def limit_arenas(environ: Mapping[str, str] = os.environ) -> int | None:
    """Cap glibc's malloc arenas at :data:`ARENAS` (threads then share them) unless the
    operator set ``MALLOC_ARENA_MAX``; the cap applied, or None (set by the environment, or
    not glibc). Call it before the service starts its threads: arenas made already stay."""
    if "MALLOC_ARENA_MAX" in environ:
        return None
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return ARENAS if mallopt(M_ARENA_MAX, ARENAS) == 1 else None
