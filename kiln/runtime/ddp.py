"""A DistributedDataParallel module called from compiled code: DDP's own steps run as torch runs
them, outside any graph, and the module it wraps runs compiled.

DDP's forward prepares its reducer, moves and casts the inputs, calls the wrapped module and
then tells the reducer which outputs the backward starts from (``_pre_forward``,
``_post_forward``). Those steps read and write the reducer's state and may talk to the other
ranks: they are not tensor programs, and kiln does not capture them (torch.compile does not
either). Capture breaks the graph at the DDP call (``values/objects.py``); the break hands the
DDP module to ``CompiledFactory.callee``, which returns ``DDPForward``: DDP's forward with the
wrapped module's call compiled for the same compile key. Its graph is cut at DDP's gradient
buckets where it is finished (``capture/ddp_buckets.py``).
"""
from __future__ import annotations

from typing import Callable

from .. import _torch


class DDPForward:
    """``ddp(*args, **kwargs)`` with the wrapped module called through ``call_module``
    (``call_module(module, *inputs, **kwargs)``, a compiled function of the module's class)."""

    __slots__ = ("ddp", "call_module")

    def __init__(self, ddp, call_module: Callable):
        self.ddp = ddp
        self.call_module = call_module

    def __call__(self, *args, **kwargs):
        ddp = self.ddp
        if not _torch.ddp_runs_plainly(ddp):
            # hooks on the DDP module itself, or a forward that skips the wrapped module's
            # __call__: DDP runs as it is (its wrapped module too)
            return ddp(*args, **kwargs)
        return _torch.run_ddp_forward(ddp, self.call_module, args, kwargs)
