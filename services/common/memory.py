"""Give freed heap memory back to the operating system (glibc ``malloc_trim``).

Building a model allocates far more than it keeps (the int8 MiniLM: ~500 MB at
peak while the float graph is quantized, ~150 MB after). glibc keeps freed
blocks in the process for reuse, so without a trim the process stays at its
peak; one trim after such a build returned ~125 MB. Elsewhere (musl, macOS), a
no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def trim_heap() -> bool:
    """Return free heap pages to the OS; True if glibc did so."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
