"""Gradients computed with ``create_graph=True`` through a compiled backward graph.

The backward graph is not differentiable itself, so its gradients (right for a first-order
``autograd.grad(..., create_graph=True)``, as in a gradient penalty's forward term, or
``jacobian(..., create_graph=True)`` that is never differentiated) carry a node that refuses a
second differentiation with a clear error, rather than a missing ``grad_fn`` that would make
the second derivative silently zero.

The refusing node takes the compiled node's leaf inputs as its own inputs: ``autograd.grad(g,
x)`` runs only the nodes on a path to ``x``, and the second derivative through the compiled
graph is such a path, which must pass through the refusal. An input that is not a leaf (made
by an earlier op) cannot be reached that way (no tensor of it is at hand in the backward), so
such a node refuses ``create_graph=True`` at once.
"""
from __future__ import annotations

import torch

_MESSAGE = ("kiln: differentiating a gradient computed through a kiln-compiled graph (double backward) "
            "is not supported: its backward graph is compiled, not differentiable. Compile the function "
            "with backend='eager' to take higher-order gradients through it.")


class _RefuseDoubleBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, n_grads, anchor, *inputs_then_grads):
        return tuple(g.clone() for g in inputs_then_grads[len(inputs_then_grads) - n_grads:])

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise RuntimeError(_MESSAGE)


def refusing_double_backward(node, grads: tuple) -> tuple:
    """``grads`` as the backward of ``node`` (its ctx) returns them, each tensor carrying the
    refusing node, which reaches every input of ``node`` (or an error now, see above)."""
    positions = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    if not positions:
        return grads
    leaves = []
    for fn, _ in node.next_functions:
        if fn is None:
            continue
        leaf = getattr(fn, "variable", None)    # (AccumulateGrad: the leaf itself)
        if leaf is None:
            raise RuntimeError(_MESSAGE + " (create_graph=True reached a compiled graph whose input is "
                               "computed by earlier ops)")
        leaves.append(leaf)
    anchor = torch.empty(0, requires_grad=True)
    wrapped = _RefuseDoubleBackward.apply(len(positions), anchor, *leaves, *[grads[i] for i in positions])
    out = list(grads)
    for i, g in zip(positions, wrapped):
        out[i] = g
    return tuple(out)
