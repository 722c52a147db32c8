"""Torch functions that take functions and that the capture models itself instead of tracing
torch's wrapper around them: ``torch.utils.checkpoint.checkpoint`` (a recompute region),
``torch.cond``, ``torch.while_loop``, torch._higher_order_ops' ``scan``, ``associative_scan``
and ``map``, and ``flex_attention`` (higher-order op nodes with subgraphs), and
``create_block_mask`` (a graph break with its reason)."""
from __future__ import annotations

from typing import Callable

from ...errors import Unsupported
from .base import ConstantValue, RealCallableValue


class ModelledFunctionValue(RealCallableValue):
    """One of these functions itself; ``capture_call(tx, args, kwargs)`` captures a call."""

    def __init__(self, fn, source, name: str, capture_call: Callable):
        super().__init__(fn, source)
        self.name = name
        self.capture_call = capture_call

    def describe(self):
        return f"Function({self.name})"

    def truthy(self, tx):
        return True

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantValue(getattr(self.fn, name))
        raise Unsupported(f"attribute {name!r} of {self.name}")

    def reconstruct(self, cg):
        return cg.bind(self.fn, self.name.rsplit(".", 1)[-1])

    def call(self, tx, args, kwargs):
        return self.capture_call(tx, args, kwargs)
