"""``tensor.untyped_storage()`` during capture: its size only.

The storage of a graph input is not described by the input's sizes and strides (a view of a
bigger tensor, a storage resized to 0 by FSDP-style code), so reading its size guards it: the
input's real ``untyped_storage().nbytes()`` becomes an EQUALS_MATCH guard. A tensor computed
in the graph that shares an input's storage (a view of it) reads and guards that input's
storage; a fresh one's size follows from the graph. Anything else a storage offers (data
pointers, resizing, copies) needs real memory: Unsupported.
"""
from __future__ import annotations

import dataclasses

import torch

from ...errors import Unsupported
from ..guards import Guard, GuardKind
from ..sources import Source
from .base import ConstantValue, Value
from .functions import MethodValue


@dataclasses.dataclass(frozen=True)
class StorageBytesSource(Source):
    """``base.untyped_storage().nbytes()`` of a tensor input."""
    base: Source

    def render(self, ctx):
        return f"{self.base.render(ctx)}.untyped_storage().nbytes()"

    def describe(self):
        return f"{self.base.describe()}.untyped_storage().nbytes()"


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())


class StorageValue(Value):
    def __init__(self, tensor):
        self.tensor = tensor

    def python_type(self):
        return torch.UntypedStorage

    def describe(self):
        return f"{self.tensor.describe()}.untyped_storage()"

    def getattr(self, tx, name):
        return MethodValue(self, name)

    def call_method(self, tx, name, args, kwargs):
        if name in ("size", "nbytes", "__len__") and not args and not kwargs:
            return ConstantValue(self.nbytes(tx))
        raise Unsupported(f"UntypedStorage.{name}() inside a compiled function (needs memory)")

    def nbytes(self, tx) -> int:
        fake = self.tensor.fake
        n = fake.untyped_storage().nbytes()
        if not isinstance(n, int):
            raise Unsupported("the size of a storage whose size is symbolic")
        for inp in tx.output.tensor_inputs:
            if _same_storage(inp.value_fake, fake):
                if inp.real is None:
                    raise Unsupported("the storage size of an input no longer held")
                tx.output.guards.add(Guard(GuardKind.EQUALS_MATCH, StorageBytesSource(inp.source),
                                           inp.real.untyped_storage().nbytes()))
        return n
