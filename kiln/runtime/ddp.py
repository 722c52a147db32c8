"""A DistributedDataParallel module called from compiled code: DDP's own steps run as torch runs
them, outside any graph, and the module it wraps runs compiled.

DDP's forward prepares its reducer, moves and casts the inputs, calls the wrapped module and
then tells the reducer which outputs the backward starts from (``_pre_forward``,
``_post_forward``). Those steps read and write the reducer's state and may talk to the other
ranks: they are not tensor programs, and kiln does not capture them (torch.compile does not
either). Capture breaks the graph at the DDP call (``values/objects.py``); the break hands the
DDP module to ``CompiledFactory.callee``, which returns ``DDPForward``: DDP's forward with the
wrapped module's call compiled for the same compile key. ``kiln.compile(ddp)`` itself is a
``CompiledDDP``, which runs ``DDPForward`` with no captured frame around it. The wrapped
module's graph is cut at DDP's gradient buckets where it is finished
(``capture/ddp_buckets.py``).
"""
from __future__ import annotations

from typing import Callable

from .. import _torch
from .module import CompiledModule, module_caller


class DDPForward:
    """``ddp(*args, **kwargs)`` with the wrapped module called through ``call_module``
    (``call_module(module, *inputs, **kwargs)``, a compiled function of the module's class)."""

    __slots__ = ("ddp", "call_module")

    def __init__(self, ddp, call_module: Callable):
        self.ddp = ddp
        self.call_module = call_module

    def __call__(self, /, *args, **kwargs):
        ddp = self.ddp
        if not _torch.ddp_runs_plainly(ddp):
            # hooks on the DDP module itself, or a forward that skips the wrapped module's
            # __call__: DDP runs as it is (its wrapped module too)
            return ddp(*args, **kwargs)
        return _torch.run_ddp_forward(ddp, self.call_module, args, kwargs)


def compiled_ddp_module(ddp, compile_function: Callable):
    """What ``kiln.compile(ddp)`` returns: a ``CompiledModule`` of the DDP module whose call is
    ``DDPForward`` straight away (no captured frame around it, so ``fullgraph=True`` holds for the
    wrapped module's graph, and a call costs no graph break). Its entries, recompile reasons and
    package are those of the wrapped module's compiled function; ``compile_function(fn)`` makes
    it, for the compile key of the ``kiln.compile`` call."""
    inner = ddp.module
    if isinstance(inner, CompiledModule):       # kiln.compile(DDP(kiln.compile(model)))
        compiled = inner.compiled_function
        forward = DDPForward(ddp, call_plainly)
    else:
        compiled = compile_function(module_caller(type(inner)))
        forward = DDPForward(ddp, compiled)
    return CompiledDDP(ddp, compiled, forward)


def call_plainly(module, *args, **kwargs):
    """The wrapped module's call when it is compiled already (``DDP(kiln.compile(model))``)."""
    return module(*args, **kwargs)


class CompiledDDP(CompiledModule):
    """``kiln.compile(ddp)``: the DDP module (its parameters, ``no_sync()``, state dict...) whose
    call runs ``DDPForward``."""

    def __init__(self, ddp, compiled, forward: DDPForward):
        super().__init__(ddp, compiled)
        object.__setattr__(self, "_kiln_ddp_forward", forward)

    def __call__(self, /, *args, **kwargs):
        return self._kiln_ddp_forward(*args, **kwargs)

    def forward(self, /, *args, **kwargs):
        return self._kiln_ddp_forward(*args, **kwargs)
