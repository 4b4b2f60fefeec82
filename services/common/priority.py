"""Background work at a lower CPU priority than request handling (Linux thread niceness).

Linux keeps a nice value per thread, and a thread inherits its creator's. A
background thread (the semantic indexer, the embedder's pool) lowers its own, so
under load the scheduler serves request threads first and the background work
takes the cores they leave idle; with nothing else to run it still gets every
core. Elsewhere, and where the kernel refuses, this does nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("engram.priority")


def lower_this_thread(niceness: int) -> bool:
    """Set the calling thread's nice value to the main thread's plus ``niceness`` (at most 19;
    0 leaves it alone), whatever it inherited from the thread that started it; True if done."""
    if niceness <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + niceness))
    except OSError as error:  # a sandbox may forbid it: run at normal priority
        log.warning("could not lower a background thread's priority: %s", error)
        return False
    return True
