"""A module tensor parallelism distributed (``parallelize_module``: its parameters are DTensors,
its hooks redistribute its inputs and outputs), called from compiled code.

kiln compiles no DTensor program: capture breaks the graph at the call of such a module
(``capture/values/objects.py``) and the break hands it to ``CompiledFactory.callee``, which
returns ``DTensorModuleCall``. The module runs as it is, hooks, DTensor dispatch and collectives
included, and the code before and after it is compiled.

Its output is handed on as plain tensors: ``RowwiseParallel``'s output (``to_local()`` of a
DTensor reduced over the ranks) is an AsyncCollectiveTensor, a wrapper waited for at its first
use. It is waited for here, on the autograd path it came on, so that the code reading it (the
residual add after an attention or MLP block) takes a plain tensor, in a graph or not. The
values are the same; only the wait comes before the next op instead of inside it. (A wrapper
that reaches a graph another way is waited for at the graph's entry: ``capture/frame.py``.)
"""
from __future__ import annotations

import torch.utils._pytree as pytree

from .. import _torch


class DTensorModuleCall:
    """``module(*args, **kwargs)``, run as it is, its AsyncCollectiveTensor outputs waited for."""

    __slots__ = ("module",)

    def __init__(self, module):
        self.module = module

    def __call__(self, /, *args, **kwargs):
        return pytree.tree_map(_torch.waited_collective, self.module(*args, **kwargs))
