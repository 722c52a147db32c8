"""What ``bool()`` and ``len()`` take from a user's ``__bool__`` and ``__len__``: CPython checks
the result (a bool; an index >= 0) and raises otherwise."""
from __future__ import annotations

import sys

from .base import Value


def checked_bool(tx, result: Value) -> bool:
    """What a user's ``__bool__`` returned, as ``bool()`` takes it: a bool, else TypeError."""
    kind = result.python_type()
    if kind is not bool:
        raise tx.user_exception(TypeError(f"__bool__ should return bool, returned {kind.__name__}"))
    return tx.truthy(result)        # (a symbolic bool is decided and guarded)


def checked_len(tx, result: Value):
    """What a user's ``__len__`` returned, as ``len()`` takes it: an int >= 0 (a symbolic size
    stays one), else eager's TypeError, ValueError or OverflowError."""
    kind = result.python_type()
    if not issubclass(kind, int):
        raise tx.user_exception(TypeError(f"'{kind.__name__}' object cannot be interpreted as an integer"))
    if not result.is_constant():
        return result
    r = result.as_constant()
    if r < 0:
        raise tx.user_exception(ValueError("__len__() should return >= 0"))
    if r > sys.maxsize:
        raise tx.user_exception(OverflowError("cannot fit 'int' into an index-sized integer"))
    return int(r)
