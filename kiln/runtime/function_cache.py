"""The compiled entries of one Python function, shared by every ``kiln.compile`` of it.

One cache per function object (so the same function compiled with two backends keeps both,
told apart by the BACKEND_MATCH check), cleared by ``kiln.reset()``.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..capture.entry import Entry
from ..process_state import function_caches, registry_lock


class FunctionCache:
    """All compiled entries of one Python function.

    ``entries`` is never changed in place: every change makes a new list, so that a thread
    that runs the call path meanwhile keeps going through the list it read (the call path
    takes no lock). Changes other than ``promote`` hold ``lock``; ``promote`` only reorders,
    for speed, and skips when another thread is changing the list."""

    __slots__ = ("entries", "limit_warned", "recompile_reasons", "frames_tried", "lock", "__weakref__")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.lock = threading.Lock()
        self.limit_warned = False
        self.recompile_reasons: list[str] = []   # why each capture after the first happened
        # compile keys whose frame records (kiln.package.frame_records) were loaded: once per process,
        # not again after reset() (whose next call captures)
        self.frames_tried: set = set()

    def promote(self, entry: Entry) -> None:
        """``entry`` first (the most recently hit is tried first)."""
        if self.lock.acquire(blocking=False):
            try:
                entries = self.entries
                if entry in entries:
                    self.entries = [entry, *(e for e in entries if e is not entry)]
            finally:
                self.lock.release()

    def add(self, entry: Entry) -> None:
        """A new entry, tried first."""
        with self.lock:
            self.entries = [entry, *self.entries]

    def extend(self, entries: list) -> None:
        """Entries tried after those there (loaded from a package or frame records)."""
        with self.lock:
            self.entries = [*self.entries, *entries]

    def replace(self, entry: Entry, by: Entry | None) -> bool:
        """``entry`` replaced by ``by`` in its place (None: removed); False if it is gone."""
        with self.lock:
            entries = self.entries
            if entry not in entries:
                return False
            self.entries = [(by if e is entry else e) for e in entries if e is not entry or by is not None]
            return True

    def clear(self) -> None:
        with self.lock:
            self.entries = []
        self.limit_warned = False
        self.recompile_reasons.clear()


_CACHE_ATTR = "__kiln_cache__"


def cache_for(fn: Callable) -> FunctionCache:
    """The entries of ``fn``, kept in the function's own ``__dict__``: entries may hold ``fn``
    (an eager entry calls it), and a global table weak in ``fn`` would then keep ``fn``, its
    closure cells and whatever they hold alive for good; in ``fn.__dict__`` they form a cycle
    that the garbage collector frees with the function."""
    held = fn.__dict__.get(_CACHE_ATTR)
    if held is None or held[0] is not fn:   # (functools.wraps copies __dict__ to wrappers)
        with registry_lock:     # (two threads compiling one function share one cache)
            held = fn.__dict__.get(_CACHE_ATTR)
            if held is None or held[0] is not fn:
                held = (fn, FunctionCache())
                fn.__dict__[_CACHE_ATTR] = held
                function_caches.add(held[1])
    return held[1]
