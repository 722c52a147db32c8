"""The callable a captured ``torch.autograd.Function`` becomes in a graph: ``apply`` of a
generated autograd.Function whose forward and backward run the graphs captured from the
user's (``values/autograd_function.py`` captures them). A module of its own: a package or a
frame record rebuilds these callables in a process that traces nothing.
"""
from __future__ import annotations

import torch


def runtime_function(user_cls: type, fwd, bwd, n_out: int, n_sfb: int, non_diff: list[int],
                     dirty_inputs: list[int], reads_grad_mode: bool = False):
    """The callable that the graph node calls: ``apply`` of a generated autograd.Function
    whose forward runs ``fwd`` (returning the outputs, then the values the backward reads:
    the first ``n_sfb`` through ``ctx.save_for_backward``, as the user saved them) and whose
    backward runs ``bwd``. ``reads_grad_mode``: the user's backward read grad mode or its
    gradients' ``requires_grad``, which ``bwd`` holds as they are without create_graph: with
    create_graph=True it refuses rather than take the other branch's gradient."""

    class CapturedFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            res = fwd(*inputs)
            outs, saved = res[:n_out], res[n_out:]
            if n_sfb:
                ctx.save_for_backward(*saved[:n_sfb])
            ctx.kiln_saved = saved[n_sfb:]
            if non_diff:
                ctx.mark_non_differentiable(*[outs[i] for i in non_diff])
            if dirty_inputs:
                ctx.mark_dirty(*[inputs[i] for i in dirty_inputs])
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            if bwd is None:   # not executable when captured: guards keep it so
                raise RuntimeError(f"kiln: the backward of {user_cls.__qualname__} was not captured")
            if reads_grad_mode and torch.is_grad_enabled():
                raise RuntimeError(
                    f"kiln: the backward of {user_cls.__qualname__} reads torch.is_grad_enabled() or its "
                    "gradients' requires_grad, and was compiled as it runs without create_graph. For "
                    "create_graph=True, call the Function from a function decorated with "
                    "torch.compiler.disable (kiln then runs it natively)")
            saved = (*ctx.saved_tensors, *ctx.kiln_saved) if n_sfb else ctx.kiln_saved
            return tuple(bwd(*grads, *saved))

    CapturedFunction.__name__ = CapturedFunction.__qualname__ = f"Captured{user_cls.__name__}"

    def call(*args):
        return CapturedFunction.apply(*args)

    call.__name__ = call.__qualname__ = f"autograd_function_{user_cls.__name__}"
    call.__module__ = "kiln"
    call.function_class = CapturedFunction
    call.user_class = user_cls
    # (what rebuilds it: a package saves these, ``runtime_function(**...)`` in a new process)
    call.kiln_captured_function = dict(user_cls=user_cls, fwd=fwd, bwd=bwd, n_out=n_out, n_sfb=n_sfb,
                                       non_diff=list(non_diff), dirty_inputs=list(dirty_inputs),
                                       reads_grad_mode=reads_grad_mode)
    return call
