"""A module whose hooks capture could not inline (FSDP2's all-gather and reshard hooks, hooks
marked to run outside torch.compile's graphs...), called from compiled code: its forward
pre-hooks and forward hooks run natively, as ``nn.Module.__call__`` runs them, and its forward
runs compiled. Calling only the compiled forward would skip the hooks, which is wrong: FSDP2's
pre-hook is what gathers the parameters the forward reads."""
from __future__ import annotations

from typing import Callable

import torch

from .. import _torch


def runs_hooks_plainly(module: torch.nn.Module) -> bool:
    """Whether ``HookedModuleCall`` can stand for ``module(...)``: only forward pre-hooks and
    forward hooks (no backward hooks, no hook that must run when forward raises, no global
    hooks). Otherwise the module is called as it is."""
    return (not module._backward_hooks and not module._backward_pre_hooks
            and not getattr(module, "_forward_hooks_always_called", None)
            and not any(_torch.global_module_hooks()))


class HookedModuleCall:
    """``module(*args, **kwargs)`` with ``forward`` (the compiled forward, bound) in place of
    the module's own, the hooks as ``nn.Module._call_impl`` runs them."""

    __slots__ = ("module", "forward")

    def __init__(self, module: torch.nn.Module, forward: Callable):
        self.module = module
        self.forward = forward

    def __call__(self, /, *args, **kwargs):
        m = self.module
        if not runs_hooks_plainly(m):
            return m(*args, **kwargs)
        for key, hook in list(m._forward_pre_hooks.items()):
            if key in m._forward_pre_hooks_with_kwargs:
                result = hook(m, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, "
                                           f"new_kwargs), but got {result}.")
                    args, kwargs = result
            else:
                result = hook(m, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        output = self.forward(*args, **kwargs)
        for key, hook in list(m._forward_hooks.items()):
            if key in m._forward_hooks_with_kwargs:
                result = hook(m, args, kwargs, output)
            else:
                result = hook(m, args, output)
            if result is not None:
                output = result
        return output
