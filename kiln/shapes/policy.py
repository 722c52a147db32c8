"""Which sizes and ints a capture makes symbolic.

``dynamic=None`` (default): static first. A later capture of the same code that sees a dim
(or an int input) with another value than before makes it symbolic ("automatic dynamic"), so
one dynamic graph serves the later sizes; the finding is kept in the code's profile
(``profile``), on disk too, for the next process. ``dynamic=True``: every dim of every tensor
input (and every int input) symbolic from the start. ``dynamic=False``: static, always.
``kiln.mark_dynamic`` / ``kiln.mark_static`` override all three per dim. Parameters and
buffers of nn.Modules stay static unless marked. Sizes 0 and 1 are always specialized.
Automatic dynamic also makes a stride symbolic that changed while the sizes stayed (a slice of
a growing buffer), and ``mark_static`` keeps a dim's stride static too.
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

    def tensor_dims(self, name: str, t: torch.Tensor, static_input: bool) -> tuple[list | None, list | None]:
        """(the DimDynamic of each dim's size of tensor input ``name``, or None when all are
        static; that of each stride, or None when every stride is static or follows the sizes)."""
        DimDynamic = _torch.DimDynamic
        forced_dyn, forced_static = marked_dynamic(t), marked_static(t)
        n = t.dim()
        strides: set[int] = set()
        if static_input:
            policy = set()              # parameters and buffers: static unless marked
        elif self.dynamic is True:
            policy = set(range(n))
        elif self.profile is not None:
            policy = self.profile.observe_tensor(name, tuple(t.shape))
            strides = self.profile.observe_strides(name, tuple(t.shape), t.stride()) - forced_static
        else:
            policy = set()
        stride_dims = [DimDynamic.DYNAMIC if i in strides else DimDynamic.INFER_STRIDE for i in range(n)] \
            if strides else None
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
        if all(d is DimDynamic.STATIC for d in dims) and stride_dims is None:
            return None, None
        return dims, stride_dims

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
