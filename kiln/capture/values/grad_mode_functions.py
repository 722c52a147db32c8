"""``@torch.no_grad()`` / ``@torch.enable_grad()`` applied inside the compiled function: the
decorated function runs inlined under that grad mode."""
from __future__ import annotations

import torch

from ...errors import Unsupported
from .base import Value
from .functions import UserFunctionValue


class GradModeFunctionValue(Value):
    """``torch.no_grad()(fn)``: calling it runs ``fn`` inlined under the grad mode, and
    restores the previous mode after (also when the call raises)."""

    def __init__(self, mode, fn: Value):
        self.mode = mode        # the GradModeValue that decorated it
        self.fn = fn

    def python_type(self):
        return type(lambda: None)

    def describe(self):
        return f"{self.mode.cls.__name__}()({self.fn.describe()})"

    def truthy(self, tx):
        return True

    def call(self, tx, args, kwargs):
        prev = torch.is_grad_enabled()
        tx.output.set_grad_enabled(self.mode.enabled)
        try:
            return tx.call(self.fn, args, kwargs)
        finally:
            tx.output.set_grad_enabled(prev)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__wrapped__"):
            return self.fn if name == "__wrapped__" else self.fn.getattr(tx, name)
        raise Unsupported(f"attribute {name!r} of a grad-mode decorated function")

    def reconstruct(self, cg):
        return cg.stash(self, lambda: f"{self.mode.reconstruct(cg)}({self.fn.reconstruct(cg)})")


def decorate_with_grad_mode(tx, mode, args, kwargs) -> Value:
    """``GradModeValue.__call__``: the decorator applied to a function."""
    if kwargs or len(args) != 1 or not isinstance(args[0], UserFunctionValue):
        raise Unsupported(f"{mode.cls.__name__}() called on {[a.describe() for a in args]}")
    code = args[0].code()
    if code.co_flags & 0x2A0:   # generator, coroutine, async generator: eager wraps differently
        raise Unsupported(f"{mode.cls.__name__}() decorating a generator or coroutine")
    return GradModeFunctionValue(mode, args[0])
