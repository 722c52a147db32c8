"""The decompositions a trace to ATen uses by default: torch's core ATen table, post-autograd
part, random ops kept whole."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(None)
def _default_decompositions() -> dict:
    """torch's core ATen decomposition table, post-autograd part.

    ``core_aten_decompositions()`` also lists CompositeImplicitAutograd ops (for export's
    pre-dispatch tracing); those never reach a post-autograd trace and are dropped. Random ops
    keep their own kernels: a decomposition (``bernoulli`` -> ``rand_like < p``) would draw
    random numbers differently from eager, and the same seed must give the same dropout mask
    (this also keeps CPU flash attention whole: its decomposition returns the attention weights
    where its backward, which autograd takes from the undecomposed op, expects the logsumexp).
    """
    from torch._decomp import core_aten_decompositions

    table = {}
    for op, fn in core_aten_decompositions().items():
        if isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_special_op_to_decompose_cia":
            continue
        if isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags:
            continue
        table[op] = fn
    return table


def default_decompositions() -> dict:
    return dict(_default_decompositions())
