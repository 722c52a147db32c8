"""A user iterator object: an instance whose class defines ``__next__`` in Python (its
``__iter__`` returning it, as iterator classes do). A ``for`` loop over it, ``list(it)`` and
unpacking call its ``__next__`` inlined, one item at a time, until it raises StopIteration, so
the object's own state (a counter, a cursor) changes as in eager."""
from __future__ import annotations

from ...errors import Unsupported
from .containers import IteratorValue
from .functions import UserFunctionValue

class UserIteratorValue(IteratorValue):
    lazy = True

    def __init__(self, obj, next_fn):
        super().__init__([])
        self.obj = obj
        self.next_fn = next_fn
        self.done = False
        self.stopped: StopIteration | None = None     # (what its __next__ raised at the end)

    def python_type(self):
        return self.obj.python_type()

    def describe(self):
        return f"user iterator {self.obj.describe()}"

    def next(self, tx):
        if self.done:
            return None
        try:
            return tx.call(UserFunctionValue(self.next_fn), [self.obj], {})
        except tx.UserException as e:
            if isinstance(e.exc, StopIteration):
                self.done = True
                self.stopped = e.exc
                return None
            raise

    def stop_iteration(self) -> StopIteration:
        """The StopIteration its ``__next__`` raised (its value is what ``yield from`` it gives)."""
        return self.stopped if self.stopped is not None else StopIteration()

    def unpack(self, tx):
        return self.take_all(tx)

    def reconstruct_remaining(self, cg) -> str:
        raise Unsupported("a user iterator object live at a graph break")

    def reconstruct(self, cg):
        return self.obj.reconstruct(cg)
