"""The compiled entries of one Python function, shared by every ``kiln.compile`` of it.

One cache per function object (so the same function compiled with two backends keeps both,
told apart by the BACKEND_MATCH check), cleared by ``kiln.reset()``.
"""
from __future__ import annotations

import weakref
from typing import Callable

from ..capture.frame import Entry


class FunctionCache:
    """All compiled entries of one Python function."""

    __slots__ = ("entries", "limit_warned", "recompile_reasons", "frames_tried", "__weakref__")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.limit_warned = False
        self.recompile_reasons: list[str] = []   # why each capture after the first happened
        # compile keys whose frame records (kiln.package.frame_records) were loaded: once per process,
        # not again after reset() (whose next call captures)
        self.frames_tried: set = set()

    def promote(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.entries.insert(0, entry)

    def clear(self) -> None:
        self.entries.clear()
        self.limit_warned = False
        self.recompile_reasons.clear()


_caches: "weakref.WeakSet[FunctionCache]" = weakref.WeakSet()   # for clear_all()
_CACHE_ATTR = "__kiln_cache__"


def cache_for(fn: Callable) -> FunctionCache:
    """The entries of ``fn``, kept in the function's own ``__dict__``: entries may hold ``fn``
    (an eager entry calls it), and a global table weak in ``fn`` would then keep ``fn``, its
    closure cells and whatever they hold alive for good; in ``fn.__dict__`` they form a cycle
    that the garbage collector frees with the function."""
    held = fn.__dict__.get(_CACHE_ATTR)
    if held is None or held[0] is not fn:   # (functools.wraps copies __dict__ to wrappers)
        held = (fn, FunctionCache())
        fn.__dict__[_CACHE_ATTR] = held
        _caches.add(held[1])
    return held[1]


def clear_all() -> None:
    """Drop every function's entries (``kiln.reset``)."""
    for c in list(_caches):
        c.clear()
