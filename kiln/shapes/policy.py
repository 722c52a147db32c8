"""Which sizes and ints a capture makes symbolic.

``dynamic=None`` (default): static first. A later capture of the same code that sees a dim
(or an int input) with another value than before makes it symbolic ("automatic dynamic"), so
one dynamic graph serves the later sizes; the finding is kept in the code's profile
(``profile``), on disk too, for the next process. ``dynamic=True``: every dim of every tensor
input (and every int input) symbolic from the start. ``dynamic=False``: static, always.
``kiln.mark_dynamic`` / ``kiln.mark_static`` override all three per dim. Parameters and
buffers of nn.Modules stay static unless marked. Sizes 0 and 1 are always specialized.
"""
from __future__ import annotations

import torch

from .. import _torch
from ..config import config
from .marks import marked_dynamic, marked_static
from .profile import profile_for

class ShapePolicy:
    def __init__(self, dynamic: bool | None, fn):
        self.dynamic = dynamic
        self.profile = profile_for(fn) if dynamic is None and config.automatic_dynamic_shapes else None

    def tensor_dims(self, name: str, t: torch.Tensor, static_input: bool) -> list | None:
        """The DimDynamic of each dim of tensor input ``name``, or None when all are static."""
        DimDynamic = _torch.DimDynamic
        forced_dyn, forced_static = marked_dynamic(t), marked_static(t)
        n = t.dim()
        if static_input:
            policy = set()              # parameters and buffers: static unless marked
        elif self.dynamic is True:
            policy = set(range(n))
        elif self.profile is not None:
            policy = self.profile.observe_tensor(name, tuple(t.shape))
        else:
            policy = set()
        dims = []
        for i in range(n):
            if i in forced_static:
                dims.append(DimDynamic.STATIC)
            elif i in forced_dyn:
                dims.append(DimDynamic.DYNAMIC)   # its own symbol, never shared by duck sizing
            elif i in policy:
                dims.append(DimDynamic.DUCK)      # equal sizes share a symbol
            else:
                dims.append(DimDynamic.STATIC)
        if all(d is DimDynamic.STATIC for d in dims):
            return None
        return dims

    def int_is_dynamic(self, name: str, value: int) -> bool:
        if config.specialize_int:
            return False
        if self.dynamic is True:
            return True
        if self.profile is not None:
            return self.profile.observe_int(name, value)
        return False

    def finish(self) -> None:
        if self.profile is not None:
            self.profile.save()
