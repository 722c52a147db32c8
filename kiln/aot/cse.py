"""Common-subexpression elimination of a joint graph, before it is partitioned.

Tracing the backward re-derives values the forward already computed: a LayerNorm's backward
recomputes the normalized input ``(x - mean) * rstd`` that its forward made. Left as two
nodes, the partitioner sees a backward that reads ``x``, ``mean`` and ``rstd`` (and recomputes
the product in the backward, in a larger backward graph) where the backward could read the
forward's own product. Merged, the min-cut chooses between them on their cost, as
torch.compile's partitioner does after its own CSE pass.

Only pure calls merge: ATen ops that neither write their arguments nor draw random numbers,
with equal arguments (the same nodes, equal constants of the same type). A value the graph
returns is never merged away: two outputs (``[x.erf(), x.erf()]``, or two gradients computed
alike) are two tensors in eager, and merged they would be one tensor returned twice, so that
writing into one would change the other (fuzz seed 1097). A later duplicate of an output may
become the output itself (the partitioner treats outputs the user sees as such).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from . import fake_propagation, fx_graphs


def eliminate_common_subexpressions(graph: torch.fx.Graph) -> int:
    """Merge duplicate pure calls of ``graph`` in place (the first one stays); returns how
    many nodes were removed."""
    first: dict = {}
    removed = 0
    returned = set(fx_graphs.flat_outputs(graph))
    for n in list(graph.nodes):
        if not is_pure(n):
            continue
        try:
            key = (n.target, _key(n.args), _key(n.kwargs))
            hash(key)
        except TypeError:       # an argument with no stable identity (a symbolic size)
            continue
        kept = first.setdefault(key, n)
        if kept is not n and n not in returned:
            n.replace_all_uses_with(kept)
            graph.erase_node(n)
            removed += 1
    return removed


def is_pure(n: torch.fx.Node) -> bool:
    """An ATen call whose only result is its value (no write to an argument, no random draw)."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    return not n.target._schema.is_mutable and not fx_graphs.is_effect(n)


def _key(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return a                                    # (nodes compare by identity)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_key(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, _key(v)) for k, v in a.items()))
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("symbolic")
    if isinstance(a, float):
        return ("float", repr(a))                   # (-0.0 and 0.0, nan: told apart)
    if isinstance(a, fake_propagation.PLAIN_CONSTANTS):
        return (type(a), a)
    # anything else (a constant tensor, an opaque object) only as the same object: its own
    # == may not return a bool (the graph keeps it alive, so its id stays its own)
    return ("object", id(a))

