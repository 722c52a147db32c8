"""Gradients computed with ``create_graph=True`` through a compiled backward graph.

The backward graph is not differentiable itself, so its gradients (right for a first-order
``autograd.grad(..., create_graph=True)``, as in a gradient penalty's forward term, or
``jacobian(..., create_graph=True)`` that is never differentiated) carry a node that refuses a
second differentiation with a clear error, rather than a missing ``grad_fn`` that would make
the second derivative silently zero.
"""
from __future__ import annotations

import torch


class _RefuseDoubleBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, *grads):
        return tuple(g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise RuntimeError(
            "kiln: differentiating a gradient computed through a kiln-compiled graph (double backward) "
            "is not supported: its backward graph is compiled, not differentiable. Compile the function "
            "with backend='eager' to take higher-order gradients through it.")


def refusing_double_backward(grads: tuple) -> tuple:
    """``grads`` as a backward returns them, each tensor carrying the refusing node."""
    positions = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    if not positions:
        return grads
    anchor = torch.empty(0, requires_grad=True)
    wrapped = _RefuseDoubleBackward.apply(anchor, *[grads[i] for i in positions])
    out = list(grads)
    for i, g in zip(positions, wrapped):
        out[i] = g
    return tuple(out)
