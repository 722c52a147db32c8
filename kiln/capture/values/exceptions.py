"""Exceptions as symbolic values: one raised or caught in the captured code
(``ExceptionValue``), and the exception that was being handled before an ``except`` block
began (``PrevExcValue``, restored when the block ends)."""
from __future__ import annotations

from ...errors import Unsupported
from ..sources import AttrSource
from .base import Value, is_constant_object


class ExceptionValue(Value):
    """An exception object: raised by the user's code during capture (and caught by its own
    handler), or read from the outside world (``source``: a continuation's handler gets the
    exception it handles as an argument)."""

    def __init__(self, exc: BaseException, source=None):
        self.exc = exc
        self.source = source
        # (capture time, instruction, execution count) where the top frame raised it
        self.raised_at: tuple[int, int, int] | None = None

    def python_type(self):
        return type(self.exc)

    def real_object(self):
        return self.exc if self.source is not None else None

    def describe(self):
        return f"{type(self.exc).__name__}({self.exc})"

    def truthy(self, tx):
        return True

    def getattr(self, tx, name):
        if name == "args":
            if self.source is not None:
                return tx.wrap(self.exc.args, AttrSource(self.source, "args"))
            return tx.wrap_pure_result(self.exc.args)
        raise Unsupported(f"attribute {name!r} of an exception")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        # an exception created during capture: a new one like it on every call (its type,
        # arguments and chaining; a traceback it gets when raised)
        exc = self.exc
        if not all(is_constant_object(a) for a in exc.args):
            raise Unsupported(f"handing over the exception {self.describe()} at a graph break")

        def build():
            chain = [ExceptionValue(c).reconstruct(cg) if c is not None else "None"
                     for c in (exc.__cause__, exc.__context__)]
            args = ", ".join(cg.constant_expr(a) for a in exc.args)
            return (f"{cg.bind(_rebuild_exception)}({cg.bind(type(exc))}, ({args}{',' if len(exc.args) == 1 else ''}), "
                    f"{chain[0]}, {chain[1]}, {exc.__suppress_context__!r})")
        # (by the exception itself: one that is also another's __context__ or __cause__ is
        # handed over as one object)
        return cg.stash(exc, build)


def _rebuild_exception(cls, args, cause, context, suppress_context):
    exc = cls(*args)
    exc.__cause__ = cause
    exc.__context__ = context
    exc.__suppress_context__ = suppress_context
    return exc


class PrevExcValue(Value):
    """What PUSH_EXC_INFO leaves under an except/finally handler: the exception handled
    before it (``prev``, restored by POP_EXCEPT), and the one this handler handles. At a
    graph break the slot is handed over as ``handled`` (see ``resume.PREV_EXC``)."""

    def __init__(self, prev: Value, handled: Value):
        self.prev = prev
        self.handled = handled

    def describe(self):
        return f"PrevExc({self.prev.describe()})"

    def reconstruct(self, cg):
        return self.handled.reconstruct(cg)

