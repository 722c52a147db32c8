"""One compile at a time in a process.

Capture, the AOT stages and Inductor keep process-wide state while they work (Inductor's
config patches and its graph context, for one), so two threads that compile at once would see
each other's. Every capture takes ``COMPILE_LOCK``, and so does every compile that happens later
on its own (a backward made at its first ``backward()``, a graph compiled for new shapes), which
may run on autograd's thread. It is re-entrant: a capture that compiles, or a continuation
captured while its function's capture runs, takes it again. Compiled code runs without it:
threads run their compiled graphs at once, and user code that a capture calls (a backward
inside the function) may compile on another thread without waiting on this one.
"""
from __future__ import annotations

import threading

COMPILE_LOCK = threading.RLock()
