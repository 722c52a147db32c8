"""The function whose call is capturing and compiling now. A graph the compile cache stores
then may grow later, at a backward(): the function's frame record is written again then."""
from __future__ import annotations

import contextlib
import contextvars
import weakref

_compiling: contextvars.ContextVar = contextvars.ContextVar("kiln_frames_compiling", default=None)


@contextlib.contextmanager
def compiling(cf):
    token = _compiling.set(weakref.ref(cf))
    try:
        yield
    finally:
        _compiling.reset(token)


def compiling_function():
    """A weak reference to the function compiling now (``compiling``), or None."""
    return _compiling.get()
