"""One compile at a time in a process, with the cyclic garbage collector paused while it runs.

Capture, the AOT stages and Inductor keep process-wide state while they work (Inductor's
config patches and its graph context, for one), so two threads that compile at once would see
each other's. Every capture takes ``COMPILE_LOCK``, and so does every compile that happens later
on its own (a backward made at its first ``backward()``, a graph compiled for new shapes), which
may run on autograd's thread. It is re-entrant: a capture that compiles, or a continuation
captured while its function's capture runs, takes it again. Compiled code runs without it:
threads run their compiled graphs at once, and user code that a capture calls (a backward
inside the function) may compile on another thread without waiting on this one.

``compile_scope(pause_gc)`` takes the lock and, for the outermost holder, pauses Python's
cyclic garbage collector (``kiln.config.pause_gc_while_compiling``). A compile makes hundreds
of thousands of objects that live until it ends (graph nodes, fake tensors, Inductor's IR), so
the collector's full passes, which walk every object of the process, run again and again and
find little: a tenth of a cold compile on a CPU. Reference counting still frees what it frees;
the cycles a compile leaves are collected after it, at the collector's next run.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

COMPILE_LOCK = threading.RLock()

_depth = 0              # (read and written under COMPILE_LOCK only)
_paused = False


@contextlib.contextmanager
def compile_scope(pause_gc: bool) -> Iterator[None]:
    """``COMPILE_LOCK``, with the garbage collector paused while the outermost holder compiles
    (``pause_gc``: ``kiln.config.pause_gc_while_compiling``, which the callers read; unless the
    user paused it already)."""
    global _depth, _paused
    with COMPILE_LOCK:
        _depth += 1
        if _depth == 1 and pause_gc and gc.isenabled():
            gc.disable()
            _paused = True
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0 and _paused:
                _paused = False
                gc.enable()
